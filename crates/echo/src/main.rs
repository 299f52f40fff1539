//! `gatehouse-echo --listen ADDR --name NAME`: the echo backend as its own program, for
//! examples, benchmarks and test pods (the production `gatehouse` binary does not carry it).

use clap::Parser;
use std::net::SocketAddr;

#[derive(Parser)]
#[command(
    name = "gatehouse-echo",
    version,
    about = "A JSON echo backend for tests and demos"
)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: SocketAddr,
    /// Name reported in every response.
    #[arg(long, default_value = "echo")]
    name: String,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(gatehouse_echo::run(gatehouse_echo::EchoOptions {
        listen: cli.listen,
        name: cli.name,
    })) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gatehouse-echo: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
