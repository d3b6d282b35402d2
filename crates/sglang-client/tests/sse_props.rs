//! Property tests of the SSE side of `SglangClient::chat_stream`, against a tiny HTTP server in this
//! test that answers `text/event-stream` with whatever bytes the case chose, written in the pieces
//! the case chose (one HTTP chunk each, flushed one by one). Arbitrary bytes never panic and always
//! end the stream (with `[DONE]` or an error, and nothing after it); a valid stream cut anywhere yields
//! exactly its data events, then `Done`.
//!
//! The server is a raw `tokio` TCP listener rather than axum, so that the test can send any bytes
//! at all and control how they are cut, without adding dependencies to this crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use ps_sglang_client::{PolicyClient, SglangClient, SglangClientConfig, SglangError, StreamEvent};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 128,
        ..ProptestConfig::default()
    }
}

/// The pieces the next connection answers with.
type Slot = Arc<Mutex<Vec<Vec<u8>>>>;

struct Fixture {
    rt: tokio::runtime::Runtime,
    client: SglangClient,
    slot: Slot,
}

static FIXTURE: LazyLock<Mutex<Fixture>> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let slot: Slot = Arc::default();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(serve(listener, slot.clone()));
    let client = SglangClient::new(SglangClientConfig {
        chat_url: format!("http://{addr}/v1/chat/completions"),
        api_key: None,
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
    })
    .unwrap();
    Mutex::new(Fixture { rt, client, slot })
});

async fn serve(listener: tokio::net::TcpListener, slot: Slot) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let slot = slot.clone();
        tokio::spawn(async move {
            let _ = sock.set_nodelay(true);
            if read_request(&mut sock).await.is_none() {
                return;
            }
            let pieces = std::mem::take(&mut *slot.lock().unwrap());
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
            if sock.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            for p in pieces.iter().filter(|p| !p.is_empty()) {
                let mut frame = format!("{:x}\r\n", p.len()).into_bytes();
                frame.extend_from_slice(p);
                frame.extend_from_slice(b"\r\n");
                if sock.write_all(&frame).await.is_err() || sock.flush().await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
            let _ = sock.write_all(b"0\r\n\r\n").await;
            let _ = sock.shutdown().await;
        });
    }
}

/// Reads one request (head and `content-length` body).
async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    Some(())
}

/// What the stream yielded: every item, in order.
type Items = Vec<Result<StreamEvent, String>>;

/// Serves `pieces` to one `chat_stream` call and collects every item of the stream.
fn run(pieces: Vec<Vec<u8>>) -> Items {
    let f = FIXTURE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *f.slot.lock().unwrap() = pieces;
    let client = f.client.clone();
    f.rt.block_on(async move {
        let stream = client
            .chat_stream(json!({"messages": [], "stream": true}).to_string().into())
            .await
            .expect("status 200");
        let collect = stream
            .map(|item| item.map_err(|e: SglangError| e.to_string()))
            .collect::<Vec<_>>();
        tokio::time::timeout(Duration::from_secs(20), collect)
            .await
            .expect("the stream ends")
    })
}

/// Cuts `bytes` at the given fractions (anywhere, even inside a UTF-8 character).
fn cut(bytes: &[u8], cuts: &[prop::sample::Index]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
}

const BOM: &[u8] = b"\xef\xbb\xbf";

/// `pieces`, with at most one BOM at the start of the body: two panic inside `eventsource-stream`
/// (see `a_body_starting_with_two_boms_does_not_panic`), which would make the properties
/// below fail at random on that one known bug. Such rare bodies are sent in one piece.
fn at_most_one_leading_bom(pieces: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let bytes = pieces.concat();
    let mut rest = &bytes[..];
    if !rest.starts_with(&[BOM, BOM].concat()) {
        return pieces;
    }
    while rest.starts_with(BOM) {
        rest = &rest[BOM.len()..];
    }
    vec![[BOM, rest].concat()]
}

/// The stream always ends, with exactly one terminal item (`Done` or an error) and nothing after.
fn assert_terminates_once(items: &Items) -> Result<(), TestCaseError> {
    let terminal = items
        .iter()
        .position(|i| !matches!(i, Ok(StreamEvent::Data(_))));
    prop_assert_eq!(
        terminal,
        items.len().checked_sub(1),
        "one terminal item, last: {:?}",
        items
    );
    Ok(())
}

/// One data payload: one line or several (joined with `\n` by the parser); never `[DONE]` and never
/// empty (an event without data is not dispatched).
fn payload() -> impl Strategy<Value = String> {
    prop_oneof![
        "[^\r\n]{1,40}",
        "\\{\"choices\": \\[\\{\"delta\": \\{\"content\": \"[a-zé🙂 ]{0,12}\"\\}\\}\\]\\}",
        ("[^\r\n]{1,10}", "[^\r\n]{0,10}").prop_map(|(a, b)| format!("{a}\n{b}")),
    ]
    .prop_filter("not the end marker", |p| p.trim() != "[DONE]")
}

/// A valid stream of `events`, with comments and other fields mixed in, in the chosen line ending.
fn encode(events: &[String], eol: &str, extras: &[u8], bom: bool) -> Vec<u8> {
    let mut out = String::new();
    if bom {
        out.push('\u{feff}');
    }
    for (i, e) in events.iter().enumerate() {
        match extras.get(i).copied().unwrap_or(0) {
            1 => out.push_str(&format!(": keep-alive{eol}")),
            2 => out.push_str(&format!("event: message{eol}")),
            3 => out.push_str(&format!("id: {i}{eol}")),
            4 => out.push_str(&format!("retry: 1000{eol}")),
            5 => out.push_str(&format!("{eol}{eol}")), // empty events are not dispatched
            _ => {}
        }
        for line in e.split('\n') {
            out.push_str(&format!("data: {line}{eol}"));
        }
        out.push_str(eol);
    }
    out.push_str(&format!("data: [DONE]{eol}{eol}"));
    out.into_bytes()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_end_the_stream_without_panicking(
        pieces in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8),
    ) {
        let items = run(at_most_one_leading_bom(pieces));
        assert_terminates_once(&items)?;
    }

    #[test]
    fn arbitrary_sse_like_text_ends_the_stream(
        lines in prop::collection::vec(
            prop_oneof![
                "data:[^\r\n]{0,12}",
                "data: \\[DONE\\]",
                ":[^\r\n]{0,8}",
                "[a-z]{0,5}:[^\r\n]{0,8}",
                "[^\r\n]{0,8}",
                Just(String::new()),
            ],
            0..16,
        ),
        eols in prop::collection::vec(prop_oneof![Just("\n"), Just("\r\n"), Just("\r")], 16),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let text: String = lines.iter().zip(&eols).map(|(l, e)| format!("{l}{e}")).collect();
        let items = run(at_most_one_leading_bom(cut(text.as_bytes(), &cuts)));
        assert_terminates_once(&items)?;
    }

    #[test]
    fn valid_streams_cut_anywhere_yield_their_events_then_done(
        events in prop::collection::vec(payload(), 0..12),
        // CR-only line endings have a test of their own.
        eol in prop_oneof![Just("\n"), Just("\r\n")],
        extras in prop::collection::vec(0u8..8, 12),
        bom in any::<bool>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        trailing in prop_oneof![Just(Vec::new()), prop::collection::vec(any::<u8>(), 0..16)],
    ) {
        let mut bytes = encode(&events, eol, &extras, bom);
        // Whatever follows `[DONE]` is never read.
        bytes.extend_from_slice(&trailing);
        let items = run(cut(&bytes, &cuts));
        let mut expected: Items = events.iter().cloned().map(|e| Ok(StreamEvent::Data(e))).collect();
        expected.push(Ok(StreamEvent::Done));
        prop_assert_eq!(items, expected);
    }
}

#[test]
fn a_valid_stream_cut_at_every_byte_yields_its_events() {
    let events = vec![
        r#"{"choices":[{"index":0,"delta":{"content":"é🙂"}}]}"#.to_owned(),
        "two\nlines".to_owned(),
    ];
    for (eol, bom) in [("\n", false), ("\r\n", true)] {
        let bytes = encode(&events, eol, &[1, 3], bom);
        let pieces: Vec<Vec<u8>> = bytes.iter().map(|b| vec![*b]).collect();
        let items = run(pieces);
        assert_eq!(
            items,
            vec![
                Ok(StreamEvent::Data(events[0].clone())),
                Ok(StreamEvent::Data(events[1].clone())),
                Ok(StreamEvent::Done)
            ],
            "eol {eol:?}"
        );
    }
}

#[test]
fn a_stream_without_done_is_an_error_after_its_events() {
    let items = run(vec![b"data: a\n\ndata: b\n\n".to_vec()]);
    assert_eq!(items.len(), 3);
    assert_eq!(items[0], Ok(StreamEvent::Data("a".into())));
    assert_eq!(items[1], Ok(StreamEvent::Data("b".into())));
    let err = items[2].as_ref().unwrap_err();
    assert!(err.contains("[DONE]"), "{err}");
}

#[test]
fn invalid_utf8_ends_the_stream_with_an_error() {
    let items = run(vec![b"data: a\n\ndata: \xff\xfe\n\n".to_vec()]);
    assert_eq!(items.first(), Some(&Ok(StreamEvent::Data("a".into()))));
    assert!(items.last().unwrap().is_err(), "{items:?}");
}

#[test]
fn a_stream_starting_with_a_bom_does_not_panic() {
    // The SSE grammar allows a BOM before the first event; it must be skipped.
    for pieces in [
        vec![b"\xef\xbb\xbfdata: a\n\ndata: [DONE]\n\n".to_vec()],
        // Split inside the BOM too.
        vec![
            b"\xef".to_vec(),
            b"\xbb\xbfdata: a\n\ndata: [DONE]\n\n".to_vec(),
        ],
    ] {
        let items = run(pieces);
        assert_eq!(
            items,
            vec![Ok(StreamEvent::Data("a".into())), Ok(StreamEvent::Done)]
        );
    }
}

#[test]
fn cr_only_line_endings_end_with_done() {
    let items = run(vec![b"data: a\r\rdata: [DONE]\r\r".to_vec()]);
    assert_eq!(
        items,
        vec![Ok(StreamEvent::Data("a".into())), Ok(StreamEvent::Done)]
    );
}

fn assert_ends(pieces: &[Vec<u8>]) {
    let items = run(pieces.to_vec());
    assert!(
        items
            .last()
            .is_some_and(|i| !matches!(i, Ok(StreamEvent::Data(_)))),
        "{pieces:?}: {items:?}"
    );
}

#[test]
fn a_body_starting_with_two_boms_does_not_panic() {
    // The second mark is not a BOM any more but a character of the first line (an unknown field).
    assert_ends(&[b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: [DONE]\n\n".to_vec()]);
    assert_ends(&[
        b"\xef\xbb\xbf".to_vec(),
        b"\xef\xbb\xbfdata: a\n\n".to_vec(),
    ]);
}

#[test]
fn bodies_that_only_look_like_a_bom_do_not_panic() {
    for pieces in [
        // A mark alone, a cut mark, a mark then invalid UTF-8.
        vec![b"\xef\xbb\xbf".to_vec()],
        vec![b"\xef\xbb".to_vec()],
        vec![b"\xef\xbb\xbf\xff".to_vec()],
        // Leading empty chunks before the mark.
        vec![Vec::new(), b"\xef\xbb\xbfdata: a\n\n".to_vec()],
    ] {
        assert_ends(&pieces);
    }
}
