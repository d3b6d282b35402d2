//! The inspection page's parts (`[inspect]`, docs/inspect.md): its history, told by the server and
//! the session buffer, and its routes, the API behind the admin key and the page open.

use std::sync::Arc;

use ps_chat_template::ChatTokenizer;
use ps_config::Settings;
use ps_core::{SampleLog, TurnObserver};
use ps_inspect::api::Live;
use ps_inspect::{HistoryLimits, Inspect, InspectHistory, LiveStatus, TokenText};
use ps_server::{AppState, ExtraRoutes};

/// The history when the page is enabled (`inspect.enabled`), bounded by `[inspect]`.
pub fn history(settings: &Settings) -> Option<Arc<InspectHistory>> {
    settings.inspect.enabled.then(|| {
        Arc::new(InspectHistory::new(HistoryLimits {
            max_sessions: settings.inspect.max_sessions,
            max_turns_per_session: settings.inspect.max_turns_per_session,
        }))
    })
}

/// The history as the observer the server and the buffer tell.
pub fn observer(history: &Arc<InspectHistory>) -> Arc<dyn TurnObserver> {
    history.clone()
}

/// The submission state, pause mode and pending turns, read from the running server.
struct ServerLive {
    app: AppState,
    mode: String,
}

impl LiveStatus for ServerLive {
    fn live(&self) -> Live {
        let (live_sessions, pending) = match self.app.rollout() {
            Some(r) => {
                let st = r.buffer.status();
                let p = st.pending;
                (
                    st.live_sessions as usize,
                    [
                        ("waiting_capture", p.waiting_capture),
                        ("waiting_next_state", p.waiting_next_state),
                        ("scoring", p.scoring),
                        ("waiting_order", p.waiting_order),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v as usize))
                    .collect(),
                )
            }
            None => (0, Default::default()),
        };
        Live {
            submission_enabled: self.app.submission_enabled(),
            pause_mode: self.app.options().pause_mode.as_str().to_owned(),
            mode: self.mode.clone(),
            live_sessions,
            pending,
        }
    }
}

/// Token texts from the policy's tokenizer.
struct PolicyTokens(Arc<ChatTokenizer>);

impl TokenText for PolicyTokens {
    fn text(&self, id: u32) -> Option<String> {
        Some(self.0.token_text(id))
    }
}

/// The page's routes over `history`: `/v1/inspect/*` (admin) reading `store` and `app`, `/ui`.
pub fn routes(
    settings: &Settings,
    history: Arc<InspectHistory>,
    app: &AppState,
    store: Arc<dyn SampleLog>,
    tokenizer: Arc<ChatTokenizer>,
) -> ExtraRoutes {
    let inspect = Inspect {
        history,
        log: Some(store),
        live: Some(Arc::new(ServerLive {
            app: app.clone(),
            mode: settings.server.mode.to_string(),
        })),
        tokens: Some(Arc::new(PolicyTokens(tokenizer))),
    };
    ExtraRoutes {
        admin: ps_inspect::api_router(inspect),
        open: ps_inspect::ui_router(),
    }
}
