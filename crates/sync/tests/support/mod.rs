//! A control plane and data planes on 127.0.0.1 with real mTLS, for the end-to-end tests.

#![allow(dead_code)] // each test binary uses a different part

use futures_util::future::BoxFuture;
use gatehouse_ir as ir;
use gatehouse_sync::{
    Applier, Ca, ClientOptions, ClientState, ConfigServer, Credentials, DataPlaneIdentity,
    ServerOptions, UnboundListener,
};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The name the control plane's certificate carries and the data planes expect.
pub const SERVER_NAME: &str = "localhost";

/// Generous for one exchange on loopback, even on a loaded 2-core CI machine.
pub const SOON: Duration = Duration::from_secs(10);

pub fn ca() -> Arc<Ca> {
    Arc::new(Ca::generate("gatehouse test CA"))
}

pub fn identity(namespace: &str, gateway: &str) -> DataPlaneIdentity {
    DataPlaneIdentity::new(namespace, gateway).unwrap()
}

/// A configuration of one Gateway; `marker` names its only cluster, so that different markers
/// give different content (and versions).
pub fn config(identity: &DataPlaneIdentity, marker: &str) -> Arc<ir::Config> {
    Arc::new(ir::Config {
        gateways: vec![ir::Gateway {
            namespace: identity.namespace.clone(),
            name: identity.gateway.clone(),
            listeners: Vec::new(),
        }],
        clusters: vec![ir::Cluster {
            name: marker.to_string(),
            protocol: ir::UpstreamProtocol::Http1,
            endpoints: vec![SocketAddr::new(LOCALHOST, 8080)],
            tls: None,
        }],
        certificates: Vec::new(),
    })
}

/// The version the control plane gives `config`.
pub fn version(config: &ir::Config) -> String {
    gatehouse_sync::version::encode(config).1
}

/// Configurations whose cluster is named this are rejected by [`TestApplier`].
pub const REJECTED: &str = "rejected-by-the-test-applier";

pub struct ControlPlane {
    pub server: Arc<ConfigServer>,
    pub address: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl ControlPlane {
    pub async fn start(ca: &Arc<Ca>, options: ServerOptions) -> Self {
        Self::start_on(ca, options, SocketAddr::new(LOCALHOST, 0)).await
    }

    pub async fn start_on(ca: &Arc<Ca>, options: ServerOptions, address: SocketAddr) -> Self {
        let server = ConfigServer::new(ca.clone(), options);
        Self::serve(server, ca, address).await
    }

    /// Serves `server` on `address` (port 0: any free port).
    pub async fn serve(server: Arc<ConfigServer>, ca: &Ca, address: SocketAddr) -> Self {
        let listener = TcpListener::bind(address).await.unwrap();
        let address = listener.local_addr().unwrap();
        let credentials = ca.issue_server(
            &[SERVER_NAME.to_string()],
            &[LOCALHOST],
            Duration::from_secs(3600),
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.clone().serve(listener, credentials, stop.clone()));
        ControlPlane {
            server,
            address,
            stop,
            task,
        }
    }

    /// Stops serving and waits until the port is free again.
    pub async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(SOON, self.task)
            .await
            .expect("the server stops in time")
            .unwrap()
            .unwrap();
    }
}

pub struct DataPlane {
    pub state: Arc<ClientState>,
    pub applier: Arc<TestApplier>,
    pub dir: tempfile::TempDir,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl DataPlane {
    /// A data plane whose credentials directory holds `credentials`.
    pub fn start(address: SocketAddr, credentials: &Credentials, pod: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        credentials.write_dir(dir.path()).unwrap();
        Self::start_in(address, dir, pod)
    }

    pub fn start_in(address: SocketAddr, dir: tempfile::TempDir, pod: &str) -> Self {
        Self::start_with(address, dir, pod, true)
    }

    /// `gzip_snapshots: false`: a data plane of a build from before `config_gzip`.
    pub fn start_older(address: SocketAddr, credentials: &Credentials, pod: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        credentials.write_dir(dir.path()).unwrap();
        Self::start_with(address, dir, pod, false)
    }

    fn start_with(address: SocketAddr, dir: tempfile::TempDir, pod: &str, gzip: bool) -> Self {
        let options = ClientOptions {
            endpoint: format!("https://{address}"),
            server_name: SERVER_NAME.to_string(),
            credentials_dir: dir.path().to_path_buf(),
            pod: pod.to_string(),
            build: "test-build".to_string(),
            gzip_snapshots: gzip,
        };
        let state = Arc::new(ClientState::new());
        let applier = Arc::new(TestApplier::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(gatehouse_sync::run(
            options,
            applier.clone(),
            state.clone(),
            stop.clone(),
        ));
        DataPlane {
            state,
            applier,
            dir,
            stop,
            task,
        }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(SOON, self.task)
            .await
            .expect("the client stops in time")
            .unwrap();
    }
}

/// Records what it is given; rejects configurations with a cluster named [`REJECTED`].
#[derive(Default)]
pub struct TestApplier {
    applied: Mutex<Vec<Arc<ir::Config>>>,
    unbound: Mutex<Vec<UnboundListener>>,
    changed: Notify,
}

impl TestApplier {
    pub fn applied(&self) -> Vec<Arc<ir::Config>> {
        self.applied.lock().unwrap().clone()
    }

    pub fn set_unbound(&self, unbound: Vec<UnboundListener>) {
        *self.unbound.lock().unwrap() = unbound;
        self.changed.notify_one();
    }
}

impl Applier for TestApplier {
    fn apply(&self, config: Arc<ir::Config>) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async move {
            if config.clusters.iter().any(|c| c.name == REJECTED) {
                return Err("rejected by the test applier".to_string());
            }
            let diagnostics = vec![format!("applied {} clusters", config.clusters.len())];
            self.applied.lock().unwrap().push(config);
            Ok(diagnostics)
        })
    }

    fn unbound(&self) -> Vec<UnboundListener> {
        self.unbound.lock().unwrap().clone()
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.changed.notified())
    }
}

pub use gatehouse_testkit::eventually;

/// Makes writing credentials into `dir` fail (a directory stands where each temporary file
/// would go), as on a read-only Secret volume; tests run as root, which ignores file modes.
pub fn make_unwritable(dir: &Path) {
    for name in [".ca.crt.tmp", ".tls.key.tmp", ".tls.crt.tmp"] {
        std::fs::create_dir(dir.join(name)).unwrap();
    }
}

/// A raw TLS connection with `client` credentials (or none), trusting `ca_pem`: whether the
/// control plane spoke HTTP/2 to it (sent its SETTINGS) rather than refusing it.
pub async fn tls_accepted(address: SocketAddr, ca_pem: &str, client: Option<&Credentials>) -> bool {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        Some(credentials) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(credentials.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(credentials.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = ServerName::try_from(SERVER_NAME).unwrap();
    // TLS 1.3: the client completes its side before the server has judged its certificate,
    // so a refusal shows on the first read, as an alert.
    let Ok(mut tls) = connector.connect(name, tcp).await else {
        return false;
    };
    let _ = tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(SOON, tls.read(&mut buf)).await,
        Ok(Ok(n)) if n > 0
    )
}
