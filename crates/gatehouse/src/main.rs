//! The `gatehouse` command.

use clap::{Parser, Subcommand};
use gatehouse::{controller, proxy, run, status_cmd, telemetry};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod arena;

/// jemalloc instead of glibc's malloc: see "Memory allocator" in docs/architecture.md. Its
/// settings are compiled in (`.cargo/config.toml`): freed pages go back within a second, from
/// a background thread.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "gatehouse",
    version,
    about = "A Kubernetes Gateway API implementation that never reloads"
)]
struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "GATEHOUSE_LOG_FORMAT"
    )]
    log_format: telemetry::LogFormat,
    /// Worker threads serving traffic (default: TOKIO_WORKER_THREADS, else one per core).
    #[arg(long, global = true, env = "GATEHOUSE_WORKERS")]
    workers: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Gateways in a file or directory of manifests, following every change live.
    Run(RunArgs),
    /// Serve the Gateways of a Kubernetes cluster and write their status (KUBECONFIG or
    /// in-cluster credentials).
    Controller(Box<ControllerArgs>),
    /// One Gateway's data plane, configured by the controller over its config sync stream
    /// (what the controller's provisioned Deployments run; needs no Kubernetes credentials).
    Proxy(ProxyArgs),
    /// Print the status Gatehouse computes for the manifests, like `kubectl get -o yaml`.
    Status {
        /// A YAML file or a directory of them.
        #[arg(short = 'f', long = "file")]
        path: PathBuf,
        /// Output format: the objects with their status (yaml, json), or a table of Gateways,
        /// listeners and routes with their conditions (wide).
        #[arg(short = 'o', long, default_value = "yaml", value_parser = ["yaml", "json", "wide"])]
        output: String,
        /// Exit non-zero on any problem, not only on files that do not load: warnings (unknown
        /// fields), conditions in a bad state, parentRefs to Gateways that do not exist,
        /// Gateways of a missing class, no objects at all. One `file:line: message` line each
        /// on stderr.
        #[arg(long)]
        strict: bool,
    },
    /// A small backend that answers with JSON describing each request (examples and tests;
    /// built with the default `echo` feature, left out of the production image).
    #[cfg(feature = "echo")]
    Echo {
        #[arg(long, default_value = "127.0.0.1:9001")]
        listen: SocketAddr,
        /// Name reported in every answer.
        #[arg(long, default_value = "echo")]
        name: String,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// A YAML file or a directory of them (read recursively).
    #[arg(short = 'f', long = "file")]
    path: PathBuf,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Args)]
struct ProxyArgs {
    /// The control plane's config sync service, `https://host:port`.
    #[arg(long, value_name = "URL")]
    control_plane: String,
    /// The name the control plane's certificate carries (default: the URL's host).
    #[arg(long, value_name = "NAME")]
    control_plane_name: Option<String>,
    /// Directory with this data plane's bootstrap credentials: tls.crt, tls.key, ca.crt.
    #[arg(long, value_name = "DIR")]
    credentials: PathBuf,
    /// This replica's name in the control plane's reports.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Args)]
struct ControllerArgs {
    /// Give each Gateway its own loopback address (127.x.y.z) to listen on, so many Gateways
    /// can share ports on one machine (local clusters, conformance tests).
    #[arg(long)]
    local_addresses: bool,
    /// controllerName of the GatewayClasses to serve.
    #[arg(long, default_value = gatehouse_translate::CONTROLLER_NAME)]
    controller_name: String,
    /// The data plane's Service, as namespace/name: Gateways report its load-balancer ingress
    /// (or cluster IP) in status.addresses instead of the address they bind.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    publish_service: Option<String>,
    /// Keep the --publish-service Service: FILE is a Service manifest without ports (type,
    /// selector, labels, annotations, traffic policy); the controller adds a TCP port per
    /// Gateway listener port and applies it whenever the ports change.
    #[arg(long, value_name = "FILE", requires = "publish_service")]
    publish_service_template: Option<PathBuf>,
    /// The Deployment (in the Service's namespace) that owns the kept Service, so that
    /// deleting it (uninstalling) deletes the Service.
    #[arg(long, value_name = "NAME", requires = "publish_service_template")]
    publish_service_owner: Option<String>,
    /// Disable leader election: this replica writes status unconditionally.
    #[arg(long)]
    no_leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "gatehouse-leader")]
    leader_election_name: String,
    /// This replica's identity in the Lease (defaults to POD_NAME or the host name and pid).
    #[arg(long, env = "POD_NAME")]
    leader_election_identity: Option<String>,
    /// How long a Lease holds without renewal.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// Provision a data plane (Deployment, Service, ServiceAccount, credentials) per Gateway
    /// and feed it over the sync stream; this process then serves no traffic itself.
    #[arg(long, requires_all = ["proxy_image", "control_plane_endpoint"])]
    provision: bool,
    /// The image provisioned data planes run (`gatehouse proxy`).
    #[arg(long, env = "GATEHOUSE_PROXY_IMAGE")]
    proxy_image: Option<String>,
    /// imagePullPolicy of the data planes' container.
    #[arg(long)]
    proxy_image_pull_policy: Option<String>,
    /// The URL data planes dial, e.g. https://gatehouse.gatehouse-system.svc:18000; its host
    /// is the name the sync server's certificate carries.
    #[arg(long)]
    control_plane_endpoint: Option<String>,
    /// Where the sync server listens.
    #[arg(long, default_value = "0.0.0.0:18000")]
    sync_address: SocketAddr,
    /// Further DNS names for the sync server's certificate.
    #[arg(long, value_delimiter = ',')]
    sync_server_names: Vec<String>,
    /// The Secret (in the leader-election namespace) that holds the control plane's CA; it is
    /// created when missing.
    #[arg(long, default_value = "gatehouse-ca")]
    ca_secret: String,
    /// Where provisioned data planes bind their listeners.
    #[arg(long, default_value = "0.0.0.0")]
    dataplane_bind_address: IpAddr,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Admin endpoint: /healthz /readyz /metrics /config_dump /status.
    #[arg(
        long,
        default_value = "127.0.0.1:9901",
        env = "GATEHOUSE_ADMIN_ADDRESS"
    )]
    admin_address: SocketAddr,
    /// Address for Gateways that do not ask for one in spec.addresses.
    #[arg(long, default_value = "0.0.0.0")]
    address: IpAddr,
    /// On SIGTERM, how long /readyz fails while the sockets still accept, before they close.
    /// Endpoint removal reaches kube-proxy and load balancers only some seconds after the pod
    /// is told to stop; responses meanwhile carry `Connection: close` (HTTP/2: GOAWAY).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    drain_delay: Duration,
    /// After the drain delay, how long in-flight requests may take to finish.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
    /// Connecting to a backend.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,
    /// Until the response headers, when the route sets no timeout ("0s" for none).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
    /// Idle keep-alive connections to backends are closed after this.
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    backend_idle_timeout: Duration,
    /// A client must send its request headers within this (HTTP/1; also how long an idle
    /// kept-alive HTTP/1 connection stays open).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    header_read_timeout: Duration,
    /// An HTTP/2 connection with no open stream for this long gets a GOAWAY and closes.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    http2_idle_timeout: Duration,
    /// HTTP/2: a PING after this much silence; a peer that does not answer within 10 s is
    /// closed ("0s": no PINGs).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    http2_keepalive_interval: Duration,
    /// A request body with no byte from the client for this long is cut off (408).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    request_body_timeout: Duration,
    /// A response body with no byte from the backend for this long (after its head) is cut
    /// off and the client connection closed.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    backend_read_timeout: Duration,
    /// A client that does not read what it is sent for this long is disconnected.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    client_write_timeout: Duration,
    /// An upgraded connection (WebSocket), TLS passthrough or TCPRoute stream with no byte
    /// either way for this long is closed.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    tunnel_idle_timeout: Duration,
    /// A UDP session (one client address and port on a UDP listener) with no datagram either
    /// way for this long ends.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    udp_idle_timeout: Duration,
    /// UDP sessions per UDP listener; datagrams of new clients beyond it are dropped.
    #[arg(long, default_value = "16384")]
    udp_max_sessions: usize,
    /// Largest request head (request line and fields); bigger ones get 431.
    #[arg(long, default_value = "65536")]
    max_request_head_bytes: usize,
    /// Largest response head a backend may send (status line and fields); a bigger one
    /// answers 502.
    #[arg(long, default_value = "65536")]
    max_response_head_bytes: usize,
    /// Open client connections per worker thread and listening address beyond which new
    /// connections are closed at once, so that established ones keep being served.
    #[arg(long, default_value = "20000")]
    max_connections_per_worker: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `status` reports problems itself (file:line on stderr); log lines would repeat them.
    let level = match cli.command {
        Command::Status { .. } => "error",
        _ => "info",
    };
    telemetry::init_logging(cli.log_format, level);
    let workers = worker_count(cli.workers);
    // `run` and `controller` serve connections on their own worker threads (see
    // gatehouse_dataplane::Options::dedicated_workers); this runtime only carries the control
    // plane and the admin server. `echo` serves on it.
    let main_threads = match cli.command {
        #[cfg(feature = "echo")]
        Command::Echo { .. } => workers,
        _ => 1,
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(main_threads).enable_all();
    // `run` and `controller` translate on this runtime: its threads (this one, its worker,
    // its blocking pool) share one allocator arena (`arena.rs`), while the data plane's
    // workers keep their own. `proxy` only decodes and compiles here, and measured more
    // memory pinned (docs/architecture.md).
    if matches!(cli.command, Command::Run(_) | Command::Controller(_)) {
        arena::pin_to_control_plane();
        runtime.on_thread_start(arena::pin_to_control_plane);
    }
    let runtime = runtime.build().expect("tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(run_options(args, workers))
                .await
                .map(|()| ExitCode::SUCCESS),
            Command::Controller(args) => run_controller(*args, workers)
                .await
                .map(|()| ExitCode::SUCCESS),
            Command::Proxy(args) => run_proxy(args, workers).await.map(|()| ExitCode::SUCCESS),
            Command::Status {
                path,
                output,
                strict,
            } => Ok(status_cmd::run(path, &output, strict)),
            #[cfg(feature = "echo")]
            Command::Echo { listen, name } => {
                gatehouse_echo::run(gatehouse_echo::EchoOptions { listen, name })
                    .await
                    .map(|()| ExitCode::SUCCESS)
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gatehouse: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--workers`, else tokio's own TOKIO_WORKER_THREADS, else one per core.
fn worker_count(flag: Option<usize>) -> usize {
    flag.or_else(|| {
        std::env::var("TOKIO_WORKER_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
    .filter(|&n| n > 0)
    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}

fn run_options(a: RunArgs, workers: usize) -> run::RunOptions {
    run::RunOptions {
        path: a.path,
        admin_address: a.serve.admin_address,
        default_address: a.serve.address,
        drain_delay: a.serve.drain_delay,
        shutdown_grace: a.serve.shutdown_grace,
        dataplane: dataplane_options(&a.serve, workers),
    }
}

async fn run_controller(a: ControllerArgs, workers: usize) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach Kubernetes: {e}"))?;
    let identity = a.leader_election_identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let lease = (!a.no_leader_election).then(|| gatehouse_controlplane::kubernetes::LeaseOptions {
        namespace: a.leader_election_namespace.clone(),
        name: a.leader_election_name.clone(),
        identity,
        lease_duration: a.lease_duration,
        renew_every: a.lease_duration / 5,
        clock_skew_secs: 0,
    });
    let provision = provision_options(&a)?;
    let opts = controller::ControllerOptions {
        provision,
        admin_address: a.serve.admin_address,
        default_address: a.serve.address,
        local_addresses: a.local_addresses,
        drain_delay: a.serve.drain_delay,
        shutdown_grace: a.serve.shutdown_grace,
        dataplane: dataplane_options(&a.serve, workers),
        lease,
        controller_name: a.controller_name,
        publish_service: match a.publish_service.as_deref().map(|s| s.split_once('/')) {
            None => None,
            Some(Some((ns, name))) => Some(gatehouse_translate::ObjectKey::new(ns, name)),
            Some(None) => anyhow::bail!("--publish-service takes namespace/name"),
        },
        publish_service_template: match &a.publish_service_template {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    anyhow::anyhow!("--publish-service-template {}: {e}", path.display())
                })?;
                let template = serde_yaml::from_str(&text).map_err(|e| {
                    anyhow::anyhow!("--publish-service-template {}: {e}", path.display())
                })?;
                Some(controller::PublishServiceTemplate {
                    template,
                    owner_deployment: a.publish_service_owner.clone(),
                })
            }
        },
    };
    run::serve_until_signal(controller::start(opts, client).await?).await;
    Ok(())
}

/// The provisioned mode's options from the flags (`None` without --provision).
fn provision_options(a: &ControllerArgs) -> anyhow::Result<Option<controller::ProvisionOptions>> {
    if !a.provision {
        return Ok(None);
    }
    let endpoint = a.control_plane_endpoint.clone().unwrap_or_default();
    let host = http::Uri::try_from(endpoint.as_str())
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_string()))
        .ok_or_else(|| anyhow::anyhow!("--control-plane-endpoint {endpoint} has no host"))?;
    let mut dns_names = Vec::new();
    let mut ips = Vec::new();
    match host.parse::<IpAddr>() {
        Ok(ip) => ips.push(ip),
        Err(_) => dns_names.push(host.clone()),
    }
    dns_names.extend(a.sync_server_names.iter().cloned());
    Ok(Some(controller::ProvisionOptions {
        ca_secret: gatehouse_translate::ObjectKey::new(
            a.leader_election_namespace.clone(),
            a.ca_secret.clone(),
        ),
        sync_address: a.sync_address,
        sync_dns_names: dns_names,
        sync_ips: ips,
        settings: gatehouse_controlplane::provision::Settings {
            image: a.proxy_image.clone().unwrap_or_default(),
            image_pull_policy: a.proxy_image_pull_policy.clone(),
            control_plane_endpoint: endpoint,
            control_plane_server_name: host,
            controller_name: a.controller_name.clone(),
        },
        dataplane_bind: a.dataplane_bind_address,
    }))
}

async fn run_proxy(a: ProxyArgs, workers: usize) -> anyhow::Result<()> {
    let name = match a.control_plane_name {
        Some(n) => n,
        None => http::Uri::try_from(a.control_plane.as_str())
            .ok()
            .and_then(|u| u.host().map(str::to_string))
            .ok_or_else(|| anyhow::anyhow!("--control-plane {} has no host", a.control_plane))?,
    };
    let pod = a.pod_name.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let opts = proxy::ProxyOptions {
        admin_address: a.serve.admin_address,
        control_plane: a.control_plane,
        control_plane_name: name,
        credentials: a.credentials,
        pod,
        drain_delay: a.serve.drain_delay,
        shutdown_grace: a.serve.shutdown_grace,
        // Each snapshot is decoded afresh and shares nothing with the last: keeping compiled
        // tables by their matches' pointers would never find one.
        dataplane: gatehouse_dataplane::Options {
            keep_compiled_hosts: false,
            ..dataplane_options(&a.serve, workers)
        },
    };
    run::serve_until_signal(proxy::start(opts).await?).await;
    Ok(())
}

fn dataplane_options(a: &ServeArgs, workers: usize) -> gatehouse_dataplane::Options {
    gatehouse_dataplane::Options {
        connect_timeout: a.connect_timeout,
        pool_idle_timeout: a.backend_idle_timeout,
        default_request_timeout: (!a.request_timeout.is_zero()).then_some(a.request_timeout),
        header_read_timeout: a.header_read_timeout,
        http2_idle_timeout: a.http2_idle_timeout,
        http2_keepalive_interval: (!a.http2_keepalive_interval.is_zero())
            .then_some(a.http2_keepalive_interval),
        request_body_timeout: a.request_body_timeout,
        backend_read_timeout: a.backend_read_timeout,
        client_write_timeout: a.client_write_timeout,
        tunnel_idle_timeout: a.tunnel_idle_timeout,
        udp_idle_timeout: a.udp_idle_timeout,
        udp_max_sessions: a.udp_max_sessions,
        max_header_bytes: a.max_request_head_bytes,
        max_response_head_bytes: a.max_response_head_bytes,
        max_connections_per_worker: a.max_connections_per_worker,
        workers,
        dedicated_workers: true,
        ..Default::default()
    }
}
