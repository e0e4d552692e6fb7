//! The Kubernetes manifests (deploy/k8s), checked as a platform team would before applying them:
//! each overlay rendered by `kubectl kustomize`, every object validated against the Kubernetes
//! API's schemas by kubernetes-validate (strict: an unknown field is an error; Kubernetes 1.29
//! and 1.37), both installed by scripts/install-k8s-tools.sh, and then read back for what a
//! cluster running it would show: every service has one workload running `allot run <service>`,
//! probed on its ops port, with resource requests, a PodDisruptionBudget and a Service exposing
//! `ops` (and, in prod, a ServiceMonitor that finds it); the SQLite services stay single; the
//! allocator keeps a standby; every object is in the namespace `allot`; every ConfigMap a pod
//! needs exists; one image for every service; NATS's configuration passes `nats-server -t`, fits
//! its volume and matches its replica count, and the streams ask for no more copies than there
//! are NATS servers; billing's price table parses.
//!
//! The validator has no schema for the Prometheus Operator's ServiceMonitor (a CRD). It skips
//! each with a warning; the test requires that the skipped objects are exactly the
//! ServiceMonitors, and checks their fields itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

/// The Kubernetes versions every object must validate against: the oldest supported and the
/// newest the validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];

/// An Allot service as the manifests must run it.
struct AllotService {
    name: &'static str,
    want_kind: &'static str,
    /// Replicas in every overlay; `None` where the count is the operator's to choose.
    want_replicas: Option<u64>,
    /// Whether a PodDisruptionBudget selects its pods.
    want_budget: bool,
}

impl AllotService {
    const fn new(name: &'static str, want_kind: &'static str) -> Self {
        AllotService {
            name,
            want_kind,
            want_replicas: None,
            want_budget: true,
        }
    }

    /// One pod of a StatefulSet, never two: SQLite has one writer.
    const fn single(name: &'static str) -> Self {
        AllotService::new(name, "StatefulSet").replicas(1)
    }

    const fn replicas(mut self, replicas: u64) -> Self {
        self.want_replicas = Some(replicas);
        self
    }

    const fn without_budget(mut self) -> Self {
        self.want_budget = false;
        self
    }
}

const SERVICES: [AllotService; 9] = [
    AllotService::single("inventory"),
    // One per GPU node, going with its node (deploy/k8s/base/collector.yaml says why no budget).
    AllotService::new("collector", "DaemonSet").without_budget(),
    // Leader and standby.
    AllotService::new("allocator", "Deployment").replicas(2),
    AllotService::single("planner"),
    AllotService::single("predictor"),
    AllotService::single("remediation"),
    AllotService::single("archiver"),
    AllotService::single("billing"),
    // More replicas are more readers.
    AllotService::new("gateway", "StatefulSet"),
];

/// An overlay and what applying it must give.
struct Overlay {
    name: &'static str,
    want_nats_replicas: u64,
    /// NATS's nodes, and the allocator's leader and standby, on different Kubernetes nodes:
    /// required (prod) rather than preferred.
    want_required_spread: bool,
    /// ServiceMonitors (components/monitoring): prod has them; dev leaves them out, as kind or
    /// minikube have no Prometheus Operator to accept them.
    want_service_monitors: bool,
    /// The image of every Allot container.
    want_allot_image: String,
}

#[test]
fn the_dev_overlay_runs_every_service_on_one_nats_server_and_validates() {
    check(&Overlay {
        name: "dev",
        want_nats_replicas: 1,
        want_required_spread: false,
        want_service_monitors: false,
        // The bare name, which Tilt replaces with its own build.
        want_allot_image: "allot".into(),
    });
}

#[test]
fn the_prod_overlay_runs_every_service_on_three_spread_nats_nodes_and_validates() {
    check(&Overlay {
        name: "prod",
        want_nats_replicas: 3,
        want_required_spread: true,
        want_service_monitors: true,
        // This release's image.
        want_allot_image: format!("allot:{}", env!("CARGO_PKG_VERSION")),
    });
}

/// Renders, validates and reads back one overlay, and fails with every problem found.
fn check(overlay: &Overlay) {
    let rendered = render(overlay.name);
    let skipped = validate(overlay.name, &rendered);
    let objects = parse(&rendered);
    let mut problems = Vec::new();

    let monitors = of_kind(&objects, "ServiceMonitor");
    let want_skipped = vec![
        "ServiceMonitor monitoring.coreos.com/v1".to_owned();
        monitors.len() * KUBERNETES_VERSIONS.len()
    ];
    if skipped != want_skipped {
        problems.push(format!(
            "the validator skipped {skipped:?}; only the {} ServiceMonitors may go unchecked by it",
            monitors.len()
        ));
    }
    if monitors.is_empty() == overlay.want_service_monitors {
        problems.push(format!(
            "{} ServiceMonitors, want them: {}",
            monitors.len(),
            overlay.want_service_monitors
        ));
    }
    for monitor in &monitors {
        check_monitor_fields(monitor, &mut problems);
    }
    check_namespaces(&objects, &mut problems);
    check_config_maps_exist(&objects, &mut problems);
    for service in &SERVICES {
        check_service(overlay, &objects, service, &mut problems);
    }
    check_images(overlay, &objects, &mut problems);
    check_nats(overlay, &objects, &mut problems);
    check_billing_prices(&objects, &mut problems);

    assert!(
        problems.is_empty(),
        "deploy/k8s/overlays/{}:\n- {}",
        overlay.name,
        problems.join("\n- ")
    );
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl kustomize deploy/k8s/overlays/<overlay>`.
fn render(overlay: &str) -> String {
    let path = format!("deploy/k8s/overlays/{overlay}");
    let out = match Command::new("kubectl")
        .args(["kustomize", &path])
        .current_dir(root())
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            panic!("kubectl is missing ({e}): run scripts/install-k8s-tools.sh (./dev test does)")
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubectl kustomize {path} failed (it needs kubectl 1.27 or newer; scripts/install-k8s-tools.sh \
         checks):\n{stderr}"
    );
    // Kustomize warns here about deprecated fields: there should be none.
    assert!(
        stderr.trim().is_empty(),
        "kubectl kustomize {path} warned:\n{stderr}"
    );
    String::from_utf8(out.stdout).expect("kustomize writes UTF-8")
}

/// Runs kubernetes-validate (strict) on the rendered objects for every version in
/// [`KUBERNETES_VERSIONS`]; fails on any error and returns what it skipped for want of a schema,
/// as `<kind> <apiVersion>`, once per version.
fn validate(overlay: &str, rendered: &str) -> Vec<String> {
    let validator = root().join(".tools/bin/kubernetes-validate");
    assert!(
        validator.exists(),
        "kubernetes-validate is missing: run scripts/install-k8s-tools.sh (./dev test does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("{overlay}.yaml"));
    std::fs::write(&file, rendered).unwrap();
    let mut cmd = Command::new(&validator);
    cmd.args(["--strict", "--quiet"]);
    for version in KUBERNETES_VERSIONS {
        cmd.args(["-k", version]);
    }
    let out = cmd.arg(&file).output().expect("kubernetes-validate runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.lines().all(|line| line.starts_with("WARN ")),
        "deploy/k8s/overlays/{overlay} does not validate against Kubernetes {KUBERNETES_VERSIONS:?} \
         (kubernetes-validate --strict):\n{report}"
    );
    // "WARN <file> Couldn't find schema for kind <kind> with api version <apiVersion> for …"
    stdout
        .lines()
        .map(|line| {
            let after = |marker: &str| line.split(marker).nth(1)?.split(' ').next();
            match (after("for kind "), after("with api version ")) {
                (Some(kind), Some(api)) => format!("{kind} {api}"),
                _ => line.to_owned(),
            }
        })
        .collect()
}

/// Every document of the rendered YAML.
fn parse(rendered: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(rendered)
        .map(|doc| Value::deserialize(doc).expect("kustomize's output parses as YAML"))
        .filter(|object| !object.is_null())
        .collect()
}

fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// The elements of a YAML list; none where the field is missing.
fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list.as_array().into_iter().flatten()
}

fn of_kind<'a>(objects: &'a [Value], want: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| kind(o) == want).collect()
}

fn config_map<'a>(objects: &'a [Value], wanted: &Value) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| kind(o) == "ConfigMap" && &o["metadata"]["name"] == wanted)
}

fn workloads(objects: &[Value]) -> impl Iterator<Item = &Value> {
    objects
        .iter()
        .filter(|o| matches!(kind(o), "Deployment" | "StatefulSet" | "DaemonSet"))
}

fn pod_labels(workload: &Value) -> &Value {
    &workload["spec"]["template"]["metadata"]["labels"]
}

fn pod_spec(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn containers(workload: &Value) -> Vec<&Value> {
    items(&pod_spec(workload)["containers"]).collect()
}

/// Whether the label selector `selector` (a `matchLabels` map) is not empty and every one of its
/// pairs is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|pairs| {
        !pairs.is_empty() && pairs.iter().all(|(k, v)| labels.get(k) == Some(v))
    })
}

/// A container's environment: the keys of the ConfigMaps its `envFrom` names, then its `env`
/// values, which win.
fn env_of(objects: &[Value], container: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for from in items(&container["envFrom"]) {
        let data = config_map(objects, &from["configMapRef"]["name"]).map(|m| &m["data"]);
        for (k, v) in data.and_then(Value::as_object).into_iter().flatten() {
            env.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
        }
    }
    for entry in items(&container["env"]) {
        if let (Some(name), Some(value)) = (entry["name"].as_str(), entry["value"].as_str()) {
            env.insert(name.to_owned(), value.to_owned());
        }
    }
    env
}

/// `size` in bytes, read with `units` (suffix, bytes); a bare number is bytes.
fn bytes(size: &str, units: &[(&str, u64)]) -> u64 {
    let (digits, unit) = units
        .iter()
        .find_map(|(suffix, unit)| size.strip_suffix(suffix).map(|d| (d, *unit)))
        .unwrap_or((size, 1));
    digits
        .parse::<u64>()
        .unwrap_or_else(|_| panic!("a size: {size:?}"))
        * unit
}

/// Kubernetes' binary quantities (`20Gi`); the volumes here use no others.
const KUBERNETES_UNITS: [(&str, u64); 4] = [
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
];
/// nats-server's sizes (`18GB`): powers of 1024, as it reads them.
const NATS_UNITS: [(&str, u64); 4] = [
    ("KB", 1 << 10),
    ("MB", 1 << 20),
    ("GB", 1 << 30),
    ("TB", 1 << 40),
];

/// What the validator cannot check for want of a schema: that a ServiceMonitor uses only fields
/// the Prometheus Operator defines (of those we need), and every endpoint has a port, an
/// interval and a timeout.
fn check_monitor_fields(monitor: &Value, problems: &mut Vec<String>) {
    let name = name(monitor);
    let mut unknown = |at: &str, object: &Value, fields: &[&str]| {
        for key in object.as_object().into_iter().flat_map(|o| o.keys()) {
            if !fields.contains(&key.as_str()) {
                problems.push(format!("ServiceMonitor {name}: unknown field {at}{key}"));
            }
        }
    };
    unknown("", monitor, &["apiVersion", "kind", "metadata", "spec"]);
    unknown(
        "metadata.",
        &monitor["metadata"],
        &["name", "namespace", "labels", "annotations"],
    );
    unknown(
        "spec.",
        &monitor["spec"],
        &["selector", "endpoints", "namespaceSelector", "jobLabel"],
    );
    unknown(
        "spec.selector.",
        &monitor["spec"]["selector"],
        &["matchLabels", "matchExpressions"],
    );
    for endpoint in items(&monitor["spec"]["endpoints"]) {
        unknown(
            "spec.endpoints[].",
            endpoint,
            &["port", "path", "interval", "scrapeTimeout", "scheme"],
        );
    }
    let seconds = |value: &Value| {
        value
            .as_str()
            .and_then(|d| d.strip_suffix('s'))
            .is_some_and(|n| n.parse::<u32>().is_ok())
    };
    let endpoints: Vec<&Value> = items(&monitor["spec"]["endpoints"]).collect();
    let complete = |e: &&Value| {
        e["port"].is_string() && seconds(&e["interval"]) && seconds(&e["scrapeTimeout"])
    };
    if endpoints.is_empty() || !endpoints.iter().all(complete) {
        problems.push(format!(
            "ServiceMonitor {name}: want endpoints, each with a port, an interval and a scrape timeout in seconds: {}",
            monitor["spec"]["endpoints"]
        ));
    }
}

fn check_namespaces(objects: &[Value], problems: &mut Vec<String>) {
    let namespaces: Vec<&str> = of_kind(objects, "Namespace")
        .into_iter()
        .map(name)
        .collect();
    if namespaces != ["allot"] {
        problems.push(format!(
            "Namespace objects {namespaces:?}, want [\"allot\"]"
        ));
    }
    for object in objects.iter().filter(|o| kind(o) != "Namespace") {
        if object["metadata"]["namespace"] != "allot" {
            problems.push(format!(
                "{} {} is not in the namespace allot",
                kind(object),
                name(object)
            ));
        }
    }
}

/// A pod whose ConfigMap is missing never starts.
fn check_config_maps_exist(objects: &[Value], problems: &mut Vec<String>) {
    for workload in workloads(objects) {
        let from_env = containers(workload)
            .into_iter()
            .flat_map(|c| items(&c["envFrom"]))
            .map(|f| &f["configMapRef"]["name"]);
        let from_volumes = items(&pod_spec(workload)["volumes"]).map(|v| &v["configMap"]["name"]);
        for wanted in from_env.chain(from_volumes).filter(|n| !n.is_null()) {
            if config_map(objects, wanted).is_none() {
                problems.push(format!(
                    "{} {} needs the ConfigMap {wanted}, which is not there",
                    kind(workload),
                    name(workload)
                ));
            }
        }
    }
}

fn check_service(
    overlay: &Overlay,
    objects: &[Value],
    service: &AllotService,
    problems: &mut Vec<String>,
) {
    let svc = service.name;
    let found: Vec<&Value> = workloads(objects)
        .filter(|w| pod_labels(w)["app.kubernetes.io/name"] == svc)
        .collect();
    let [workload] = found.as_slice() else {
        problems.push(format!("{svc}: {} workloads, want one", found.len()));
        return;
    };
    let labels = pod_labels(workload);
    if kind(workload) != service.want_kind {
        problems.push(format!(
            "{svc}: a {}, want a {}",
            kind(workload),
            service.want_kind
        ));
    }
    let replicas = &workload["spec"]["replicas"];
    if service
        .want_replicas
        .is_some_and(|want| replicas.as_u64() != Some(want))
    {
        problems.push(format!(
            "{svc}: {replicas} replicas, want {:?}",
            service.want_replicas
        ));
    }
    let [container] = containers(workload)[..] else {
        problems.push(format!("{svc}: want one container"));
        return;
    };
    if container["args"] != serde_json::json!(["run", svc]) {
        problems.push(format!(
            "{svc}: runs {}, want `allot run {svc}`",
            container["args"]
        ));
    }
    if !items(&container["ports"]).any(|p| p["name"] == "ops" && p["containerPort"] == 9090) {
        problems.push(format!("{svc}: no container port `ops` (9090)"));
    }
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        if get["path"] != path || get["port"] != "ops" {
            problems.push(format!(
                "{svc}: {probe} is {}, want GET {path} on port ops",
                container[probe]
            ));
        }
    }
    let requests = &container["resources"]["requests"];
    if !requests["cpu"].is_string() || !requests["memory"].is_string() {
        problems.push(format!(
            "{svc}: resource requests {requests}, want cpu and memory"
        ));
    }

    let budgets = of_kind(objects, "PodDisruptionBudget")
        .into_iter()
        .filter(|b| selects(&b["spec"]["selector"]["matchLabels"], labels))
        .count();
    if budgets != usize::from(service.want_budget) {
        problems.push(format!(
            "{svc}: {budgets} PodDisruptionBudgets select its pods, want {}",
            usize::from(service.want_budget)
        ));
    }

    // The Services that reach its pods' ops port, and the ServiceMonitors that find one of them.
    let exposing: Vec<&Value> = of_kind(objects, "Service")
        .into_iter()
        .filter(|s| selects(&s["spec"]["selector"], labels))
        .filter(|s| {
            items(&s["spec"]["ports"]).any(|p| {
                p["name"] == "ops" && (p["targetPort"] == "ops" || p["targetPort"] == 9090)
            })
        })
        .collect();
    if exposing.is_empty() {
        problems.push(format!(
            "{svc}: no Service selects its pods with a port named ops"
        ));
    }
    let monitored = of_kind(objects, "ServiceMonitor").into_iter().any(|m| {
        exposing.iter().any(|s| {
            selects(
                &m["spec"]["selector"]["matchLabels"],
                &s["metadata"]["labels"],
            )
        }) && items(&m["spec"]["endpoints"]).any(|e| e["port"] == "ops" && e["path"] == "/metrics")
    });
    if monitored != overlay.want_service_monitors {
        problems.push(format!(
            "{svc}: scraped by a ServiceMonitor: {monitored}, want {}",
            overlay.want_service_monitors
        ));
    }

    let url = env_of(objects, container).remove("ALLOT_NATS_URL");
    if url.as_deref() != Some("nats://nats:4222") {
        problems.push(format!(
            "{svc}: ALLOT_NATS_URL is {url:?}, want the NATS Service, nats://nats:4222"
        ));
    }
}

/// One image for every Allot container, and for NATS the version the test suite runs.
fn check_images(overlay: &Overlay, objects: &[Value], problems: &mut Vec<String>) {
    let nats =
        allot_testkit::nats_server_binary().expect("nats-server: run scripts/install-nats.sh");
    let version = Command::new(nats)
        .arg("--version")
        .output()
        .expect("nats-server --version");
    // "nats-server: v2.15.1"
    let version = String::from_utf8_lossy(&version.stdout);
    let want_nats = format!(
        "nats:{}-alpine",
        version.trim().rsplit('v').next().unwrap_or_default()
    );
    for workload in workloads(objects) {
        for container in containers(workload) {
            let image = container["image"].as_str().unwrap_or_default();
            let want = if container["name"] == "nats" {
                &want_nats
            } else {
                &overlay.want_allot_image
            };
            if image != want {
                problems.push(format!(
                    "{} {}: image {image:?}, want {want:?}",
                    kind(workload),
                    name(workload)
                ));
            }
        }
    }
}

fn check_nats(overlay: &Overlay, objects: &[Value], problems: &mut Vec<String>) {
    let Some(nats) = workloads(objects).find(|w| kind(w) == "StatefulSet" && name(w) == "nats")
    else {
        problems.push("no StatefulSet nats".into());
        return;
    };
    let replicas = nats["spec"]["replicas"].as_u64().unwrap_or(1);
    if replicas != overlay.want_nats_replicas {
        problems.push(format!(
            "NATS: {replicas} servers, want {}",
            overlay.want_nats_replicas
        ));
    }
    let budget = of_kind(objects, "PodDisruptionBudget")
        .into_iter()
        .any(|b| {
            b["spec"]["maxUnavailable"] == 1
                && selects(&b["spec"]["selector"]["matchLabels"], pod_labels(nats))
        });
    if !budget {
        problems.push("NATS: no PodDisruptionBudget keeping all but one server up".into());
    }

    // A stream asking for more copies than there are servers cannot be created.
    for workload in workloads(objects).filter(|w| name(w) != "nats") {
        for container in containers(workload) {
            let copies = env_of(objects, container).remove("ALLOT_STREAM_REPLICAS");
            if !copies
                .as_deref()
                .and_then(|c| c.parse::<u64>().ok())
                .is_some_and(|c| (1..=replicas).contains(&c))
            {
                problems.push(format!(
                    "{}: ALLOT_STREAM_REPLICAS is {copies:?}, with {replicas} NATS servers",
                    name(workload)
                ));
            }
        }
    }

    // Spread over Kubernetes nodes, required in prod; the allocator's two likewise.
    for (workload, pods) in [("nats", "nats"), ("allocator-default", "allocator")] {
        let Some(w) = workloads(objects).find(|w| name(w) == workload) else {
            continue;
        };
        let terms = &pod_spec(w)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
        let required = items(terms).any(|t| {
            t["topologyKey"] == "kubernetes.io/hostname"
                && t["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == pods
        });
        if required != overlay.want_required_spread {
            problems.push(format!(
                "{workload}: one per node required: {required}, want {}",
                overlay.want_required_spread
            ));
        }
    }

    let [container] = containers(nats)[..] else {
        problems.push("NATS: want one container".into());
        return;
    };
    let store = env_of(objects, container)
        .remove("JS_MAX_FILE_STORE")
        .unwrap_or_default();
    let volume =
        nats["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
            .as_str()
            .unwrap_or("0");
    // JetStream's own files need room beyond the messages.
    if bytes(&store, &NATS_UNITS) > bytes(volume, &KUBERNETES_UNITS) / 10 * 9 {
        problems.push(format!(
            "NATS: max_file_store {store} leaves less than a tenth of its {volume} volume free"
        ));
    }

    // The configuration as the servers read it.
    let mounted = items(&pod_spec(nats)["volumes"])
        .find(|v| v["name"] == "config")
        .map(|v| &v["configMap"]["name"]);
    let Some(conf) = mounted
        .and_then(|m| config_map(objects, m))
        .and_then(|m| m["data"]["nats.conf"].as_str())
    else {
        problems.push("NATS: no nats.conf in the ConfigMap mounted as config".into());
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nats.conf");
    std::fs::write(&file, conf).unwrap();
    let test = Command::new(allot_testkit::nats_server_binary().expect("nats-server"))
        .arg("-c")
        .arg(&file)
        .arg("-t")
        .env("SERVER_NAME", "nats-0")
        .env("JS_MAX_FILE_STORE", &store)
        .output()
        .expect("nats-server -t runs");
    if !test.status.success() {
        problems.push(format!(
            "NATS: nats-server -t rejects nats.conf: {}",
            String::from_utf8_lossy(&test.stderr)
        ));
    }
    // A single server in a cluster block would wait for a quorum that never comes; a cluster
    // routes to every server.
    if replicas == 1 && conf.contains("cluster {") {
        problems.push("NATS: one server, configured as a cluster".into());
    }
    for i in (0..replicas).filter(|_| replicas > 1) {
        let route = format!("nats-{i}.nats-headless:6222");
        if !conf.contains(&route) {
            problems.push(format!("NATS: {replicas} servers, but no route to {route}"));
        }
    }
}

/// Billing refuses to start without a price table: ALLOT_PRICES names a file on a mounted
/// ConfigMap, and that file parses.
fn check_billing_prices(objects: &[Value], problems: &mut Vec<String>) {
    let Some(billing) = workloads(objects).find(|w| name(w) == "billing") else {
        return;
    };
    let Some(container) = containers(billing).into_iter().next() else {
        return;
    };
    let Some(prices) = env_of(objects, container).remove("ALLOT_PRICES") else {
        problems.push("billing: no ALLOT_PRICES".into());
        return;
    };
    let path = Path::new(&prices);
    let mount = items(&container["volumeMounts"])
        .find(|m| m["mountPath"].as_str().map(Path::new) == path.parent());
    let volume =
        mount.and_then(|m| items(&pod_spec(billing)["volumes"]).find(|v| v["name"] == m["name"]));
    let key = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    let table = volume
        .and_then(|v| config_map(objects, &v["configMap"]["name"]))
        .and_then(|m| m["data"][key].as_str());
    match table.map(allot_prices::PriceTable::parse) {
        Some(Ok(_)) => {}
        Some(Err(e)) => problems.push(format!("billing: the price table does not parse: {e}")),
        None => problems.push(format!(
            "billing: ALLOT_PRICES={prices} is on no mounted ConfigMap"
        )),
    }
}
