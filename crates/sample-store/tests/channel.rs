//! The in-process channel sink.

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use ps_core::{SampleSink, SinkError};
use ps_sample_store::channel_sink;
use support::sample;

#[tokio::test(start_paused = true)]
async fn submit_waits_for_room_and_numbers_samples() {
    let (sink, mut receiver) = channel_sink(1);
    assert_eq!(sink.submit(&sample("a")).await.unwrap(), 1);

    // Full: the second submit waits (the paused clock runs out the timeout instead).
    let blocked = tokio::time::timeout(Duration::from_secs(5), sink.submit(&sample("b"))).await;
    assert!(
        blocked.is_err(),
        "submit must wait while the channel is full"
    );

    let first = receiver.recv().await.unwrap();
    assert_eq!(first.seq, 1);
    assert_eq!(first.sample.index, 1);
    assert_eq!(first.sample.group_index, 1);
    assert_eq!(first.sample.session_id, "a");

    // The timed-out submit took no seq.
    assert_eq!(sink.submit(&sample("c")).await.unwrap(), 2);
    let second = receiver.recv().await.unwrap();
    assert_eq!((second.seq, second.sample.index), (2, 2));
    assert_eq!(second.sample.session_id, "c");
    assert_eq!(sink.last_seq(), 2);
}

#[tokio::test]
async fn submit_fails_with_closed_once_the_receiver_is_dropped() {
    let (sink, receiver) = channel_sink(4);
    drop(receiver);
    assert!(matches!(
        sink.submit(&sample("a")).await,
        Err(SinkError::Closed)
    ));
}

/// Polls `fut` once: `true` when it is still waiting.
async fn is_pending<F: Future>(fut: &mut Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await
}

#[tokio::test]
async fn a_waiting_submit_goes_through_once_there_is_room() {
    let (sink, mut receiver) = channel_sink(1);
    sink.submit(&sample("a")).await.unwrap();
    let b = sample("b");
    let waiting = sink.submit(&b);
    let mut waiting = std::pin::pin!(waiting);
    assert!(is_pending(&mut waiting).await, "the channel is full");
    assert_eq!(sink.last_seq(), 1, "no seq taken while waiting");
    assert_eq!(receiver.recv().await.unwrap().sample.session_id, "a");
    assert_eq!(waiting.await.unwrap(), 2);
    let second = receiver.recv().await.unwrap();
    assert_eq!((second.seq, second.sample.session_id.as_str()), (2, "b"));
}

#[tokio::test]
async fn a_submit_waiting_for_room_fails_with_closed_when_the_receiver_goes() {
    let (sink, receiver) = channel_sink(1);
    sink.submit(&sample("a")).await.unwrap();
    let b = sample("b");
    let waiting = sink.submit(&b);
    let mut waiting = std::pin::pin!(waiting);
    // The submit is waiting for room before the receiver goes (not merely not yet started).
    assert!(is_pending(&mut waiting).await, "the channel is full");
    drop(receiver);
    assert!(matches!(waiting.await, Err(SinkError::Closed)));
    assert_eq!(sink.last_seq(), 1, "the failed submit took no seq");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submitters_are_delivered_in_seq_order() {
    let (sink, mut receiver) = channel_sink(4);
    let mut handles = Vec::new();
    for task in 0..8 {
        let sink = sink.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..20 {
                sink.submit(&sample(&format!("{task}-{i}"))).await.unwrap();
            }
        }));
    }
    drop(sink);
    let mut seqs = Vec::new();
    while let Some(item) = receiver.recv().await {
        assert_eq!(item.sample.index, item.seq);
        seqs.push(item.seq);
    }
    for handle in handles {
        handle.await.unwrap();
    }
    assert_eq!(seqs, (1..=160).collect::<Vec<u64>>());
}
