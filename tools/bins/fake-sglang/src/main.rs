//! `fake-sglang`: serves the SGLang simulator of `ps-fake-sglang` on a TCP port, for demos, manual
//! testing and benchmarks. Never a production component.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use ps_chat_template::ChatTokenizer;
use ps_fake_sglang::{DEFAULT_PREFIX_CACHE_BYTES, FakeSglang, Fault};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "A fake SGLang server (chat completions, /generate) for tests and demos"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 30001)]
    port: u16,
    /// HuggingFace model directory (tokenizer.json + tokenizer_config.json); default: the embedded
    /// mini model. Reported by /get_model_info and /v1/models (`root`), as SGLang reports its model
    /// path (default: the mini model's directory in this source tree).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Model name listed by /v1/models.
    #[arg(long, default_value = "default")]
    model_name: String,
    /// Delay before the first byte of each answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Delay between streamed chunks, in milliseconds.
    #[arg(long, default_value_t = 0)]
    token_delay_ms: u64,
    /// Require `Authorization: Bearer <KEY>` (except on /health*).
    #[arg(long, env = "FAKE_SGLANG_API_KEY")]
    api_key: Option<String>,
    /// Answer without reasoning_content (no <think> block).
    #[arg(long)]
    no_reasoning: bool,
    /// Keep only this many recorded requests (memory stays flat over long benchmark runs).
    #[arg(long, default_value_t = 1000)]
    record_limit: usize,
    /// Bound of the cache of encoded prompt prefixes, in MiB: a conversation's next prompt encodes
    /// only what is new, as a real server's prefix cache (the ids are the same). 0 turns it off.
    #[arg(long, default_value_t = DEFAULT_PREFIX_CACHE_BYTES >> 20)]
    prefix_cache_mib: usize,
    /// Encode every prompt whole (the same as `--prefix-cache-mib 0`).
    #[arg(long)]
    no_prefix_cache: bool,
    /// Fault applied to every request: refuse, delay:MS, status:CODE[:BODY], garbage, cut:N, error:N.
    #[arg(long)]
    fault: Option<Fault>,
    /// Serve a mixture-of-experts model with `--enable-return-routed-experts`: LAYERS:TOP_K:EXPERTS
    /// (for example 4:2:16). Answers carry `sglext.routed_experts` when asked
    /// (`return_routed_experts`) and `GET /get_server_info` reports the flag.
    #[arg(long, value_name = "LAYERS:TOP_K:EXPERTS", value_parser = parse_routing)]
    routed_experts: Option<ps_fake_sglang::MoeRouting>,
}

fn parse_routing(text: &str) -> Result<ps_fake_sglang::MoeRouting, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let [layers, top_k, experts] = parts.as_slice() else {
        return Err(format!("{text:?} is not LAYERS:TOP_K:EXPERTS"));
    };
    let n = |s: &str| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
    Ok(ps_fake_sglang::MoeRouting {
        layers: n(layers)?,
        top_k: n(top_k)?,
        experts: u32::try_from(n(experts)?).map_err(|e| e.to_string())?,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let tokenizer = match &args.model_dir {
        Some(dir) => ChatTokenizer::from_dir(dir)
            .with_context(|| format!("cannot load the model directory {}", dir.display()))?,
        None => ChatTokenizer::mini(),
    };
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let mut builder = FakeSglang::builder().tokenizer(Arc::new(tokenizer));
    if let Some(routing) = args.routed_experts {
        builder = builder.quirks(ps_fake_sglang::Quirks {
            routed_experts: Some(routing),
            ..Default::default()
        });
    }
    // Report the directory the model was loaded from, as SGLang does (the mini model's by default).
    if let Some(dir) = &args.model_dir {
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        builder = builder.model_path(Some(&dir.to_string_lossy()));
    }
    let handle = builder
        .model_name(&args.model_name)
        .latency(Duration::from_millis(args.latency_ms))
        .token_delay(Duration::from_millis(args.token_delay_ms))
        .api_key(args.api_key)
        .reasoning(!args.no_reasoning)
        .record_limit(args.record_limit)
        .prefix_cache_bytes(if args.no_prefix_cache {
            0
        } else {
            args.prefix_cache_mib << 20
        })
        .serve(listener)
        .await
        .context("cannot start the server")?;
    handle.set_fault(args.fault);
    println!("fake-sglang listening on {}", handle.base_url());
    tracing::info!(addr = %handle.addr(), "fake-sglang ready");
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for ctrl-c")?;
    tracing::info!("shutting down");
    handle.shutdown().await;
    Ok(())
}
