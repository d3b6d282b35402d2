# Everyday commands; .ci/run mirrors `lint` and `test`.

# Run the self-contained demo on the embedded defaults.
demo:
    cargo run --release --bin policy-serving -- demo

# Screenshots of the inspection page (overview, timeline, sample view) into docs/img: the demo's
# conversation in headless chromium (apt-get install chromium chromium-driver).
screenshots:
    POLICY_SERVING_SCREENSHOTS={{justfile_directory()}}/docs/img POLICY_SERVING_REQUIRE_BROWSER=1 cargo test -p policy-serving --test inspect

# The tests (the golden tokenizer tests read ../shared/fixtures/qwen3 when present).
test:
    cargo test --workspace

# Formatting and lints, as CI runs them.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    python3 scripts/module_cycles.py

# The benchmarks (see docs/benchmarks.md): the proxy against the fake SGLang (the chat workload,
# then the agent scenario with a 0 ms and a 200 ms upstream), then the store, the pull API and OPD
# end to end. Extra arguments go to the load generator's chat workload.
bench *ARGS:
    cargo build --release -p policy-serving -p fake-sglang -p loadgen
    cargo run --release -p loadgen -- --stream --rounds 5 {{ARGS}}
    cargo run --release -p loadgen -- agent --json target/bench-agent.json
    cargo run --release -p loadgen -- agent --fake-latency-ms 200 --ramp-ms 200 --json target/bench-agent-200ms.json
    cargo bench -p ps-sample-store --bench store
    cargo bench -p ps-app --bench pull
    cargo bench -p ps-app --bench opd
    cargo bench -p ps-server --bench capture
    cargo bench -p ps-server --bench session_infer

# The soak (docs/benchmarks.md, "Soak"): 10,000 sessions of 5-20 turns through the proxy in RL mode,
# a trainer pulling the samples, the proxy's memory over the run. Extra arguments go to
# `loadgen soak` (`just soak --sessions 50` is a quick check).
soak *ARGS:
    cargo build --release -p policy-serving -p fake-sglang -p loadgen
    cargo run --release -p loadgen -- soak --json target/soak.json {{ARGS}}

# The agent scenario alone (docs/benchmarks.md, "The agent scenario"): 64 sessions of 10-30 turns
# with a shared system prompt and tools, RL mode, a trainer. Extra arguments go to `loadgen agent`
# (`just agent --fake-latency-ms 200 --ramp-ms 200`).
agent *ARGS:
    cargo build --release -p policy-serving -p fake-sglang -p loadgen
    cargo run --release -p loadgen -- agent {{ARGS}}
