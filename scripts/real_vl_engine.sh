#!/usr/bin/env bash
# The real vision-language engine of tests/real_vl_engine.rs: vLLM 0.32 on this CPU (the venv of
# ../shared/real-engine) serving a tiny random-weight Qwen2-VL made by scripts/make_tiny_vl.py.
#
#   scripts/real_vl_engine.sh setup          # torchvision into the venv, the model into $DIR
#   scripts/real_vl_engine.sh serve [PORT]   # start it (default 8012), wait until healthy
#   scripts/real_vl_engine.sh stop [PORT]
#
# DIR: $POLICY_SERVING_VL_DIR, default ~/.cache/policy-serving-ci/tiny-vl (made again when
# make_tiny_vl.py changes); the server's pid and log beside it, in $DIR.run (kept across a remake). The venv: $REALVLLM_DIR/venv (../shared/real-engine/setup.sh makes it).
# Qwen2-VL's processor in transformers needs torchvision (its video processor), which the engine's
# setup leaves out: the PyPI wheel matching the venv's torch is added here.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(dirname "$HERE")"
VENV="${REALVLLM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/real-vllm}/venv"
DIR="${POLICY_SERVING_VL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/policy-serving-ci/tiny-vl}"
QWEN3="${POLICY_SERVING_SHARED:-$REPO/../shared}/fixtures/qwen3"
RUN="$DIR.run"
TORCHVISION=0.28.0   # the release built against the venv's torch 2.13.0

case "${1:-}" in
setup)
    "$VENV/bin/python" -c "import torchvision" 2>/dev/null \
        || "$VENV/bin/pip" install -q --no-deps "torchvision==$TORCHVISION"
    STAMP="$(sha256sum "$HERE/make_tiny_vl.py" | cut -c1-16)"
    if [ "$(cat "$DIR/.made-by" 2>/dev/null)" != "$STAMP" ]; then
        rm -rf "$DIR"
        mkdir -p "$DIR"
        LOG="$(mktemp)"
        if ! "$VENV/bin/python" "$HERE/make_tiny_vl.py" "$DIR" "$QWEN3" > "$LOG" 2>&1; then
            cat "$LOG" >&2
            exit 1
        fi
        rm -f "$LOG"
        echo "$STAMP" > "$DIR/.made-by"
    fi
    echo "tiny Qwen2-VL ready in $DIR"
    ;;
serve)
    PORT="${2:-8012}"
    URL="http://127.0.0.1:$PORT"
    mkdir -p "$RUN"
    LOG="$RUN/serve-$PORT.log"
    PIDF="$RUN/serve-$PORT.pid"
    healthy() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health" 2>/dev/null)" = 200 ]; }
    alive() { [ -f "$PIDF" ] && kill -0 "$(cat "$PIDF")" 2>/dev/null; }
    if healthy && ! alive; then
        echo "port $PORT already serves /health, but not from a server this script started" >&2
        exit 1
    fi
    # Started by this script before (healthy, or still starting): waited for, not started twice.
    if ! alive; then
        VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
            setsid "$VENV/bin/vllm" serve "$DIR" --host 127.0.0.1 --port "$PORT" \
                --served-model-name qwen2-vl-tiny --max-model-len 4096 --dtype bfloat16 \
                --enforce-eager --limit-mm-per-prompt '{"image": 4, "video": 0}' \
                > "$LOG" 2>&1 < /dev/null &
        echo $! > "$PIDF"
    fi
    PID="$(cat "$PIDF")"
    T0=$(date +%s)
    until healthy; do
        if ! kill -0 "$PID" 2>/dev/null; then
            echo "vllm (pid $PID) exited during start-up; last log lines:" >&2
            tail -30 "$LOG" >&2
            rm -f "$PIDF"
            exit 1
        fi
        if [ $(( $(date +%s) - T0 )) -ge "${SERVE_TIMEOUT:-600}" ]; then
            echo "not healthy after ${SERVE_TIMEOUT:-600}s; see $LOG" >&2
            exit 1
        fi
        sleep 1
    done
    echo "healthy on $URL (pid $PID) after $(( $(date +%s) - T0 ))s; log $LOG"
    ;;
stop)
    PORT="${2:-8012}"
    PIDF="$RUN/serve-$PORT.pid"
    if [ -f "$PIDF" ]; then
        PID="$(cat "$PIDF")"
        # The whole process group (setsid made the server its leader): its engine-core and
        # worker children too, also when the leader is gone already.
        kill -TERM -- "-$PID" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 -- "-$PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$PID" 2>/dev/null || true
    fi
    rm -f "$PIDF"
    ;;
*)
    echo "usage: $0 setup | serve [PORT] | stop [PORT]" >&2
    exit 2
    ;;
esac
