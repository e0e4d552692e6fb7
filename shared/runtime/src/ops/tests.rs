use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use super::*;
use crate::Service;

async fn get(app: &Router, path: &str) -> (StatusCode, String, Option<String>) {
    let response = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        String::from_utf8(body.to_vec()).unwrap(),
        content_type,
    )
}

#[tokio::test]
async fn readyz_is_503_until_the_service_runs_with_every_gate_open_and_again_once_it_stops() {
    let readiness = Readiness::default();
    let app = app(readiness.clone());
    let (status, body, _) = get(&app, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body, "no service is running\n");

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut service = Service::<std::io::Error>::reporting_to(&readiness, "billing", async {
        let _ = stopped.await;
    });
    let gate = service.gate("consumer DECISIONS");
    let (opened, open) = tokio::sync::oneshot::channel::<()>();
    service.spawn("consumer DECISIONS", async move {
        let _ = open.await;
        gate.open();
        std::future::pending::<()>().await;
        Ok(())
    });
    let (status, body, _) = get(&app, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "billing starting: consumer DECISIONS\n");

    let running = tokio::spawn(service.run());
    tokio::task::yield_now().await;
    let (status, body, _) = get(&app, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "billing starting: consumer DECISIONS\n"
        ),
        "running, but its consumer is not there yet"
    );

    opened.send(()).unwrap();
    let mut answer = get(&app, "/readyz").await;
    for _ in 0..100 {
        if answer.0 == StatusCode::OK {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        answer = get(&app, "/readyz").await;
    }
    assert_eq!(
        (answer.0, answer.1.as_str()),
        (StatusCode::OK, "billing ready\n")
    );

    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    let (status, body, _) = get(&app, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
}

#[tokio::test]
async fn readyz_says_stopping_while_the_service_finishes_its_work() {
    let readiness = Readiness::default();
    let app = app(readiness.clone());
    let mut service = Service::<std::io::Error>::reporting_to(&readiness, "planner", async {});
    let stopping = service.stopping();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    service.spawn("relay", async move {
        stopping.await;
        let _ = finished.await;
        Ok(())
    });
    let running = tokio::spawn(service.run());
    let mut answer = get(&app, "/readyz").await;
    for _ in 0..100 {
        if answer.1 == "planner stopping\n" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        answer = get(&app, "/readyz").await;
    }
    assert_eq!(
        (answer.0, answer.1.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "planner stopping\n")
    );
    finish.send(()).unwrap();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn healthz_answers_and_metrics_come_as_prometheus_text() {
    let app = app(Readiness::default());
    let (status, body, _) = get(&app, "/healthz").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));

    let counter: prometheus_client::metrics::counter::Counter = crate::metrics::register(
        "test_ops_scraped",
        "Counted for the ops test",
        Default::default(),
    );
    counter.inc();
    let (status, body, content_type) = get(&app, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        content_type.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        body.lines().any(|l| l == "allot_test_ops_scraped_total 1"),
        "{body}"
    );
}

#[tokio::test]
async fn serve_answers_on_a_real_listener() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, async {
        let _ = stopped.await;
    }));
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: ops\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.ends_with("\r\n\r\nok\n"), "{response}");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
