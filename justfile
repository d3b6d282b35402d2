# Everyday commands; .ci/run mirrors `lint` and `test`.

# Run the self-contained demo on the embedded defaults.
demo:
    cargo run --release --bin policy-serving -- demo

# Screenshots of the inspection page (overview, timeline, sample view) into docs/img: the demo's
# conversation in headless chromium (apt-get install chromium chromium-driver).
screenshots:
    POLICY_SERVING_SCREENSHOTS={{justfile_directory()}}/docs/img POLICY_SERVING_REQUIRE_BROWSER=1 cargo test -p policy-serving --test e2e inspect::

# The tests (the golden tokenizer tests read ../shared/fixtures/qwen3 when present).
test:
    cargo test --workspace

# Formatting and lints, as CI runs them.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    python3 scripts/module_cycles.py
    python3 scripts/host_only_deps.py --check

# The benchmarks (see docs/benchmarks.md): the proxy against the fake SGLang (the chat workload,
# its proxied phase also with the inspection page open; 1,000 concurrent sessions with a 200 ms
# upstream; the agent scenario with a 0 ms and a 200 ms upstream, and in OPD mode), then the store, the pull API
# and OPD end to end, capture, session inference and the answer's single pass. Their plots go to
# docs/img. Extra arguments go to the chat workload.
bench *ARGS:
    cargo build --release -p policy-serving -p fake-sglang -p loadgen
    cargo run --release -p loadgen -- --stream --rounds 5 --open-pages 1 --svg docs/img {{ARGS}}
    cargo run --release -p loadgen -- --sessions 1000 --fake-latency-ms 200 --ramp-ms 2000 --max-seconds 300 --json target/bench-1000.json --svg docs/img
    cargo run --release -p loadgen -- agent --runs 3 --json target/bench-agent.json --svg docs/img
    cargo run --release -p loadgen -- agent --runs 3 --fake-latency-ms 200 --ramp-ms 200 --json target/bench-agent-200ms.json --svg docs/img
    cargo run --release -p loadgen -- agent --mode opd --runs 3 --json target/bench-agent-opd.json
    cargo bench -p ps-sample-store --bench store
    cargo bench -p ps-sample-store --bench experts
    cargo bench -p ps-app --bench pull
    cargo bench -p ps-app --bench opd
    cargo bench -p ps-capture --bench capture
    cargo bench -p ps-server --bench session_infer
    cargo bench -p ps-sglang-client --bench answer
    cargo bench -p ps-doors --bench translate

# The soak (docs/benchmarks.md, "Soak"): 10,000 sessions of 5-20 turns through the proxy in RL mode,
# a trainer pulling the samples, the proxy's memory over the run (plotted into docs/img). Extra
# arguments go to `loadgen soak` (`just soak --sessions 50` is a quick check).
soak *ARGS:
    cargo build --release -p policy-serving -p fake-sglang -p loadgen
    cargo run --release -p loadgen -- soak --json target/soak.json --svg docs/img {{ARGS}}

# The agent scenario alone (docs/benchmarks.md, "The agent scenario"): 64 sessions of 10-30 turns
# with a shared system prompt and tools, RL mode, a trainer. Extra arguments go to `loadgen agent`
# (`just agent --fake-latency-ms 200 --ramp-ms 200`, `just agent --mode opd --runs 3`).
agent *ARGS:
    cargo build --release -p policy-serving -p fake-sglang -p loadgen
    cargo run --release -p loadgen -- agent {{ARGS}}
