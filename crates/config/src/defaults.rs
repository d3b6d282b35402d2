//! The built-in defaults: the lowest configuration layer. Every key has one named constant here, so
//! the README, the example files and the code agree.

/// `server.host`: loopback only, so a fresh install is not reachable from the network.
pub const SERVER_HOST: &str = "127.0.0.1";
/// `server.port`: the port the reference proxy listens on.
pub const SERVER_PORT: u16 = 30000;
/// `server.submission_enabled`.
pub const SERVER_SUBMISSION_ENABLED: bool = true;
/// `server.session_timeout_sec`.
pub const SERVER_SESSION_TIMEOUT_SEC: u64 = 600;
/// `server.max_sessions`.
pub const SERVER_MAX_SESSIONS: usize = 10_000;
/// `server.served_model_name`.
pub const SERVER_SERVED_MODEL_NAME: &str = "default";
/// `server.max_body_bytes`: 16 MiB.
pub const SERVER_MAX_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// `server.shutdown_grace_sec`.
pub const SERVER_SHUTDOWN_GRACE_SEC: u64 = 30;
/// `server.max_messages`.
pub const SERVER_MAX_MESSAGES: usize = 4096;
/// `server.max_turn_tokens`.
pub const SERVER_MAX_TURN_TOKENS: usize = 131_072;
/// `server.pause_hold_max_sec`.
pub const SERVER_PAUSE_HOLD_MAX_SEC: u64 = 30;

/// `sglang.chat_url`.
pub const SGLANG_CHAT_URL: &str = "http://127.0.0.1:30001/v1/chat/completions";
/// `sglang.timeout_sec`.
pub const SGLANG_TIMEOUT_SEC: u64 = 120;
/// `sglang.connect_timeout_sec`.
pub const SGLANG_CONNECT_TIMEOUT_SEC: u64 = 5;
/// `sglang.stream`.
pub const SGLANG_STREAM: bool = true;
/// `sglang.max_concurrency`.
pub const SGLANG_MAX_CONCURRENCY: usize = 256;
/// `sglang.max_answer_mib`: the largest non-streamed answer read.
pub const SGLANG_MAX_ANSWER_MIB: u64 = 128;

/// `prm.enabled`.
pub const PRM_ENABLED: bool = true;
/// `prm.router_url`.
pub const PRM_ROUTER_URL: &str = "http://127.0.0.1:30002/generate";
/// `prm.num_votes`.
pub const PRM_NUM_VOTES: u32 = 3;
/// `prm.timeout_sec`.
pub const PRM_TIMEOUT_SEC: u64 = 60;
/// `prm.temperature`.
pub const PRM_TEMPERATURE: f64 = 0.6;
/// `prm.max_new_tokens`.
pub const PRM_MAX_NEW_TOKENS: u32 = 4096;
/// `prm.max_concurrency`.
pub const PRM_MAX_CONCURRENCY: usize = 64;
/// `prm.max_backlog`.
pub const PRM_MAX_BACKLOG: usize = 4096;

/// `provider.max_concurrency`.
pub const PROVIDER_MAX_CONCURRENCY: usize = 4;
/// `provider.timeout_sec`.
pub const PROVIDER_TIMEOUT_SEC: u64 = 90;
/// `provider.max_retries`.
pub const PROVIDER_MAX_RETRIES: u32 = 3;
/// `provider.deadline_sec`.
pub const PROVIDER_DEADLINE_SEC: u64 = 180;

/// `teacher.max_concurrency`.
pub const TEACHER_MAX_CONCURRENCY: usize = 3;
/// `teacher.timeout_sec`.
pub const TEACHER_TIMEOUT_SEC: u64 = 120;

/// `opd.eval_mode`: no PRM evaluation votes beside OPD.
pub const OPD_EVAL_MODE: bool = false;
/// `opd.top_k`: 0 turns top-K distillation off.
pub const OPD_TOP_K: usize = 0;
/// `opd.select_best_hint`.
pub const OPD_SELECT_BEST_HINT: bool = true;
/// `opd.drop_without_next_state`.
pub const OPD_DROP_WITHOUT_NEXT_STATE: bool = true;
/// `opd.min_hint_chars`.
pub const OPD_MIN_HINT_CHARS: usize = 10;

/// `logging.level`.
pub const LOGGING_LEVEL: &str = "INFO";

/// `capture.train_eos_without_logprob`.
pub const CAPTURE_TRAIN_EOS_WITHOUT_LOGPROB: bool = true;
/// `capture.train_unsampled`.
pub const CAPTURE_TRAIN_UNSAMPLED: bool = false;
/// `capture.drift_check_first`.
pub const CAPTURE_DRIFT_CHECK_FIRST: u64 = 100;
/// `capture.drift_check_every`.
pub const CAPTURE_DRIFT_CHECK_EVERY: u64 = 100;
/// `capture.max_image_mib`: an image's bytes (decoded) at most.
pub const CAPTURE_MAX_IMAGE_MIB: u64 = 20;
/// `capture.max_images_per_turn`.
pub const CAPTURE_MAX_IMAGES_PER_TURN: usize = 64;
/// `capture.max_held_experts_mib`: routed experts held by turns waiting to become samples.
pub const CAPTURE_MAX_HELD_EXPERTS_MIB: u64 = 4096;
/// `capture.max_queued_mib`.
pub const CAPTURE_MAX_QUEUED_MIB: u64 = 256;

/// `inspect.enabled`.
pub const INSPECT_ENABLED: bool = true;
/// `inspect.max_sessions`.
pub const INSPECT_MAX_SESSIONS: usize = 1000;
/// `inspect.max_turns_per_session`.
pub const INSPECT_MAX_TURNS_PER_SESSION: usize = 256;

/// `store.path`.
pub const STORE_PATH: &str = "./data/samples";
/// `store.retain_committed`.
pub const STORE_RETAIN_COMMITTED: u64 = 10_000;
/// `store.redis.url`.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
/// `store.redis.deployment`.
pub const REDIS_DEPLOYMENT: &str = "default";
/// `store.redis.group`.
pub const REDIS_GROUP: &str = "trainer";
/// `store.redis.claim_idle_sec`.
pub const REDIS_CLAIM_IDLE_SEC: u64 = 300;
/// `store.redis.timeout_sec`.
pub const REDIS_TIMEOUT_SEC: u64 = 5;
/// `store.redis.retry_for_sec`.
pub const REDIS_RETRY_FOR_SEC: u64 = 60;
