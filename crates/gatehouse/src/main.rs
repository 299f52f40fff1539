//! The `gatehouse` command.

use clap::{Parser, Subcommand};
use gatehouse::{echo, run, status_report, telemetry};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Gateways in a file or directory of manifests, following every change live.
    Run(RunArgs),
    /// Print the status Gatehouse computes for the manifests, like `kubectl get -o yaml`.
    Status {
        /// A YAML file or a directory of them.
        #[arg(short = 'f', long = "file")]
        path: PathBuf,
        /// Output format.
        #[arg(short = 'o', long, default_value = "yaml", value_parser = ["yaml", "json"])]
        output: String,
    },
    /// A small backend that answers with JSON describing each request.
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
    /// On SIGTERM, how long in-flight requests may take to finish.
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
    /// A client must send its request headers within this.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    header_read_timeout: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init_logging(cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(run_options(args))
                .await
                .map(|()| ExitCode::SUCCESS),
            Command::Status { path, output } => Ok(status(path, &output)),
            Command::Echo { listen, name } => echo::run(echo::EchoOptions { listen, name })
                .await
                .map(|()| ExitCode::SUCCESS),
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

fn run_options(a: RunArgs) -> run::RunOptions {
    run::RunOptions {
        path: a.path,
        admin_address: a.admin_address,
        default_address: a.address,
        shutdown_grace: a.shutdown_grace,
        dataplane: gatehouse_dataplane::Options {
            connect_timeout: a.connect_timeout,
            pool_idle_timeout: a.backend_idle_timeout,
            default_request_timeout: (!a.request_timeout.is_zero()).then_some(a.request_timeout),
            header_read_timeout: a.header_read_timeout,
            ..Default::default()
        },
    }
}

/// Errors go to stderr and make the exit code 1, so `status` doubles as a manifest check in CI.
fn status(path: PathBuf, output: &str) -> ExitCode {
    let mut source = gatehouse_controlplane::FileSource::new(path);
    let loaded = source.load();
    for e in &loaded.errors {
        eprintln!("error: {e}");
    }
    let out = gatehouse_translate::translate(&loaded.input, &Default::default());
    let mut st = out.status;
    status_report::stamp(
        &mut st,
        &Default::default(),
        k8s_openapi::jiff::Timestamp::now(),
    );
    let objects = status_report::objects(&loaded.input, &st);
    if output == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects})
            )
            .unwrap_or_default()
        );
    } else {
        print!("{}", status_report::to_yaml(&objects));
    }
    if loaded.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
