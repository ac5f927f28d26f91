//! `tollgate-example-gateway --listen 127.0.0.1:8080 --tollgate
//! 127.0.0.1:7700 --admin 127.0.0.1:7701`: the example gateway in front of
//! a Tollgate server (see the crate docs for its routes).

use std::net::SocketAddr;

use clap::Parser;
use tollgate_client::{Client, ClientConfig};

#[derive(Parser)]
struct Args {
    /// Where the gateway listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The Tollgate server(s); give a primary and its standby to follow
    /// failovers.
    #[arg(long, default_value = "127.0.0.1:7700", value_delimiter = ',')]
    tollgate: Vec<String>,
    /// The server's admin API, for the rule table.
    #[arg(long)]
    admin: Option<String>,
    /// Gateways sharing the limits (the local fallback enforces 1/N each).
    #[arg(long, default_value_t = 1)]
    gateways: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt::init();
    let args = Args::parse();
    let config = ClientConfig {
        admin: args.admin,
        client_name: "tollgate-example-gateway".into(),
        fallback: Some(tollgate_client::FallbackConfig {
            gateways: args.gateways,
            ..Default::default()
        }),
        ..ClientConfig::default()
    };
    let client = Client::new_shard(args.tollgate, config)?;
    let app = tollgate_example_gateway::app(client)?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(listen = %args.listen, "gateway serving");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
