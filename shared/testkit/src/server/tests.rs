use super::*;

fn config() -> Config {
    Config {
        server_name: "n1".to_owned(),
        port: 4222,
        monitor_port: 8222,
        store_dir: PathBuf::from("/tmp/store"),
        cluster: None,
        extra: String::new(),
    }
}

#[test]
fn single_server_config_has_loopback_listeners_and_bounded_jetstream() {
    let rendered = config().render();

    assert_eq!(
        rendered,
        "server_name: \"n1\"\n\
         listen: \"127.0.0.1:4222\"\n\
         http: \"127.0.0.1:8222\"\n\
         jetstream {\n\
         \x20 store_dir: \"/tmp/store\"\n\
         \x20 max_memory_store: 256MB\n\
         \x20 max_file_store: 2GB\n\
         }\n"
    );
}

#[test]
fn clustered_config_routes_to_every_node_and_ends_with_the_extra_text() {
    let rendered = Config {
        cluster: Some(ClusterConfig {
            name: "allot-test".to_owned(),
            port: 6222,
            routes: vec![6222, 6223],
        }),
        extra: "accounts { A: {} }".to_owned(),
        ..config()
    }
    .render();

    assert!(
        rendered.contains(
            "cluster {\n  name: \"allot-test\"\n  listen: \"127.0.0.1:6222\"\n  routes: [\n    \
             \"nats-route://127.0.0.1:6222\"\n    \"nats-route://127.0.0.1:6223\"\n  ]\n}\n"
        ),
        "{rendered}"
    );
    assert!(rendered.ends_with("}\naccounts { A: {} }\n"), "{rendered}");
}

#[test]
fn quotes_and_backslashes_in_strings_are_escaped() {
    assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
}
