//! The learner's worker registry and a worker's announcements over real
//! gRPC on loopback: registrations arrive and repeat, a learner that comes
//! up late is found, and a wrong token, another protocol version or an
//! address the learner cannot dial are refused with the reason.

use std::net::SocketAddr;
use std::time::Duration;

use grpo_worker::proto::worker_registry_client::WorkerRegistryClient;
use grpo_worker::{AuthToken, ClientTls, PROTOCOL_VERSION, Registration, RegistryServer, WorkerError, announce, proto};
use tokio::sync::mpsc;
use tonic::Code;

const EVERY: Duration = Duration::from_millis(100);

fn token(secret: &str) -> AuthToken {
    AuthToken::new(secret).unwrap()
}

/// A registry on a free loopback port, serving in the background.
async fn registry(addr: SocketAddr) -> (SocketAddr, mpsc::UnboundedReceiver<Registration>) {
    let (server, registrations) = RegistryServer::bind(addr, token("s3cret"), EVERY).await.unwrap();
    let bound = server.local_addr();
    tokio::spawn(server.serve());
    (bound, registrations)
}

async fn next(registrations: &mut mpsc::UnboundedReceiver<Registration>) -> Registration {
    tokio::time::timeout(Duration::from_secs(10), registrations.recv())
        .await
        .expect("a registration within 10 s")
        .expect("the registry is open")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_registers_and_keeps_announcing_itself() {
    let (learner, mut registrations) = registry("127.0.0.1:0".parse().unwrap()).await;
    let announcing = tokio::spawn(async move {
        announce(
            &learner.to_string(),
            "127.0.0.1:7001",
            &token("s3cret"),
            &ClientTls::default(),
            |_| {},
        )
        .await
    });
    let expected = Registration {
        address: "127.0.0.1:7001".to_string(),
    };
    for _ in 0..3 {
        assert_eq!(next(&mut registrations).await, expected);
    }
    assert!(!announcing.is_finished(), "it announces until refused");
    announcing.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_learner_that_comes_up_later_is_found() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let learner: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (changes, mut heard) = mpsc::unbounded_channel();
    let announcing = tokio::spawn(async move {
        announce(
            &learner.to_string(),
            "127.0.0.1:7002",
            &token("s3cret"),
            &ClientTls::default(),
            move |state| {
                let _ = changes.send(state.is_ok());
            },
        )
        .await
    });
    assert_eq!(
        heard.recv().await,
        Some(false),
        "first told that the learner does not answer"
    );
    let (_, mut registrations) = registry(learner).await;
    assert_eq!(next(&mut registrations).await.address, "127.0.0.1:7002");
    assert_eq!(heard.recv().await, Some(true), "then that it registered");
    announcing.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_token_ends_the_announcements_with_the_reason() {
    let (learner, mut registrations) = registry("127.0.0.1:0".parse().unwrap()).await;
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        announce(
            &learner.to_string(),
            "127.0.0.1:7003",
            &token("wrong"),
            &ClientTls::default(),
            |_| {},
        ),
    )
    .await
    .expect("refused at once, not retried");
    assert!(
        matches!(
            &refused,
            WorkerError::Rpc {
                code: Code::Unauthenticated,
                ..
            }
        ),
        "{refused}"
    );
    assert!(refused.is_refusal());
    assert!(registrations.try_recv().is_err(), "nothing registered");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_protocol_version_or_an_undialable_address_is_refused_naming_it() {
    let (learner, mut registrations) = registry("127.0.0.1:0".parse().unwrap()).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{learner}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer: tonic::metadata::MetadataValue<_> = "Bearer s3cret".parse().unwrap();
    let mut client = WorkerRegistryClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
        request.metadata_mut().insert("authorization", bearer.clone());
        Ok(request)
    });
    let register = |protocol_version: u32, address: &str| proto::RegisterRequest {
        protocol_version,
        address: address.to_string(),
    };

    let other = PROTOCOL_VERSION + 1;
    let status = client.register(register(other, "127.0.0.1:7004")).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains(&format!("protocol version {other}"))
            && status.message().contains(&format!("speaks {PROTOCOL_VERSION}")),
        "{}",
        status.message()
    );
    for bad in ["", "not an address with spaces"] {
        let status = client.register(register(PROTOCOL_VERSION, bad)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}");
        assert!(status.message().contains("--advertise"), "{}", status.message());
    }
    assert!(registrations.try_recv().is_err(), "nothing registered");

    let answer = client
        .register(register(PROTOCOL_VERSION, "127.0.0.1:7004"))
        .await
        .unwrap();
    assert_eq!(answer.into_inner().announce_every_ms, EVERY.as_millis() as u64);
    assert_eq!(next(&mut registrations).await.address, "127.0.0.1:7004");
}
