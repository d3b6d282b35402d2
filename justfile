# Everyday commands; .ci/run mirrors `lint` and `test`.

# Run the self-contained demo on the embedded defaults.
demo:
    cargo run --release --bin policy-serving -- demo

# The tests (the golden tokenizer tests read ../shared/fixtures/qwen3 when present).
test:
    cargo test --workspace

# Formatting and lints, as CI runs them.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# The load-generator benchmark (see docs/benchmarks.md).
bench:
    cargo build --release -p policy-serving -p fake-sglang -p loadgen
    ./target/release/loadgen
