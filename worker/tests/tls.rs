//! TLS for the worker and the registry, with certificates made for the test
//! (a CA and a server certificate for 127.0.0.1 and localhost): a caller
//! that trusts the CA is served; a plain-HTTP caller, a caller trusting
//! another CA and one dialling a name the certificate does not hold are
//! not; bad certificate, key and CA files are refused naming the file.

#[path = "../../rollout/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fixture;
use grpo_rollout::request::{Request, SamplingParams};
use grpo_worker::{AuthToken, ClientTls, RegistryServer, ServerTls, WorkerClient, WorkerError, WorkerServer, announce};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// A CA's certificate, and a server certificate and key it signed for `names`.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(dir: &Path, label: &str, names: &[&str]) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = CertificateParams::new(names).unwrap().signed_by(&key, &ca).unwrap();
    let write = |name: &str, text: String| {
        let path = dir.join(format!("{label}-{name}"));
        std::fs::write(&path, text).unwrap();
        path
    };
    Pki {
        ca: write("ca.pem", ca.pem()),
        cert: write("cert.pem", cert.pem()),
        key: write("key.pem", key.serialize_pem()),
    }
}

fn token() -> AuthToken {
    AuthToken::new("tls-test-token").unwrap()
}

/// A worker serving TLS with `pki`'s certificate on a free loopback port.
async fn tls_worker(pki: &Pki) -> String {
    let client = common::cpu_client();
    let engine = common::engine(&client, fixture("llama").to_str().unwrap(), 2, 32);
    let tls = ServerTls::from_pem_files(&pki.cert, &pki.key).unwrap();
    let server = WorkerServer::bind("127.0.0.1:0".parse().unwrap(), engine, token())
        .await
        .unwrap()
        .with_tls(tls);
    let port = server.local_addr().port();
    tokio::spawn(server.serve());
    format!("127.0.0.1:{port}")
}

fn request() -> Request {
    Request {
        prompt: vec![17, 99, 3],
        params: SamplingParams {
            max_tokens: 3,
            temperature: 0.0,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_worker_serves_callers_that_trust_its_ca_and_no_others() {
    let dir = tempfile::tempdir().unwrap();
    let ours = pki(dir.path(), "ours", &["127.0.0.1", "localhost"]);
    let theirs = pki(dir.path(), "theirs", &["127.0.0.1", "localhost"]);
    let address = tls_worker(&ours).await;
    let trusting = ClientTls::from_ca_file(&ours.ca).unwrap();

    // Scheme-less with a CA means https; the token still goes with every call.
    let mut worker = WorkerClient::connect(&address, &token(), &trusting).await.unwrap();
    let samples = worker.generate(&request()).await.unwrap().all().await.unwrap();
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0].tokens.len(), 3);
    assert!(!worker.health().await.unwrap().paused);
    // An explicit https URL, and the name "localhost" the certificate holds.
    let port = address.rsplit(':').next().unwrap();
    let mut by_name = WorkerClient::connect(&format!("https://localhost:{port}"), &token(), &trusting)
        .await
        .unwrap();
    by_name.health().await.unwrap();

    // Plain HTTP/2 to a TLS server: no answer.
    let mut plain = WorkerClient::connect(&address, &token(), &ClientTls::default()).await;
    if let Ok(client) = &mut plain {
        assert!(
            client.health().await.is_err(),
            "a plain-HTTP call was answered by a TLS server"
        );
    }
    // Another CA: the handshake fails.
    let distrusting = ClientTls::from_ca_file(&theirs.ca).unwrap();
    let refused = match WorkerClient::connect(&address, &token(), &distrusting).await {
        Ok(mut client) => client.health().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "a caller trusting another CA was served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = pki(dir.path(), "elsewhere", &["worker.example"]);
    let address = tls_worker(&elsewhere).await;
    let trusting = ClientTls::from_ca_file(&elsewhere.ca).unwrap();
    let answer = match WorkerClient::connect(&address, &token(), &trusting).await {
        Ok(mut client) => client.health().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(
        answer.is_err(),
        "a certificate for worker.example was accepted for 127.0.0.1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_register_with_a_tls_registry() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), "registry", &["127.0.0.1"]);
    let (server, mut registrations) =
        RegistryServer::bind("127.0.0.1:0".parse().unwrap(), token(), Duration::from_millis(200))
            .await
            .unwrap();
    let server = server.with_tls(ServerTls::from_pem_files(&pki.cert, &pki.key).unwrap());
    let learner = server.local_addr().to_string();
    tokio::spawn(server.serve());

    let trusting = ClientTls::from_ca_file(&pki.ca).unwrap();
    let announcing = {
        let learner = learner.clone();
        tokio::spawn(async move { announce(&learner, "https://127.0.0.1:7101", &token(), &trusting, |_| {}).await })
    };
    let registration = tokio::time::timeout(Duration::from_secs(20), registrations.recv())
        .await
        .expect("no registration over TLS in 20 s")
        .unwrap();
    assert_eq!(registration.address, "https://127.0.0.1:7101");
    announcing.abort();

    // A worker announcing in plain HTTP/2 is never registered.
    let plain =
        tokio::spawn(
            async move { announce(&learner, "127.0.0.1:7102", &token(), &ClientTls::default(), |_| {}).await },
        );
    let nothing = tokio::time::timeout(Duration::from_secs(2), registrations.recv()).await;
    assert!(
        nothing.is_err(),
        "a plain-HTTP announcement reached a TLS registry: {nothing:?}"
    );
    plain.abort();
}

#[test]
fn bad_tls_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = pki(dir.path(), "good", &["127.0.0.1"]);
    let other = pki(dir.path(), "other", &["127.0.0.1"]);
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");

    let message = |e: WorkerError| e.to_string();
    let e = message(ClientTls::from_ca_file(&garbage).unwrap_err());
    assert!(e.contains("garbage.pem") && e.contains("no certificate"), "{e}");
    let e = message(ClientTls::from_ca_file(&missing).unwrap_err());
    assert!(e.contains("missing.pem") && e.contains("cannot read"), "{e}");
    let e = message(ServerTls::from_pem_files(&garbage, &good.key).unwrap_err());
    assert!(e.contains("garbage.pem"), "{e}");
    // A key that is not the certificate's.
    let e = message(ServerTls::from_pem_files(&good.cert, &other.key).unwrap_err());
    assert!(e.contains("other-key.pem") && e.contains("does not go with"), "{e}");
    // A certificate given as the key.
    let e = message(ServerTls::from_pem_files(&good.cert, &good.cert).unwrap_err());
    assert!(e.contains("good-cert.pem"), "{e}");
    assert!(ServerTls::from_pem_files(&good.cert, &good.key).is_ok());
}
