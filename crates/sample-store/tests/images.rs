//! Images of samples: kept once per content hash however many samples reference them, readable
//! while a kept sample references them, deleted once none does, durable across a reopen (they
//! are written in the transaction of the first sample that references them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::Arc;

use ps_core::SampleLog;
use ps_core::sample::{Sample, SampleImage};
use ps_sample_store::SampleStore;
use support::{config, sample};

fn image(fill: u8, len: usize) -> SampleImage {
    let bytes: Arc<[u8]> = vec![fill; len].into();
    SampleImage {
        hash: format!("{fill:064x}"),
        mime: "image/png".into(),
        width: 10,
        height: 10,
        tokens: 4,
        bytes: Some(bytes),
    }
}

fn with_images(tag: &str, images: Vec<SampleImage>) -> Sample {
    Sample {
        images,
        ..sample(tag)
    }
}

#[tokio::test]
async fn an_image_resent_by_a_thousand_samples_is_stored_once_and_goes_after_the_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(config(dir.path(), 0, 64)).unwrap();
    // 1 MB, more than one chunk; sent by every turn of a conversation, with a second image in
    // the last 10.
    let big = image(7, 1 << 20);
    let other = image(9, 1000);
    let mut last = 0;
    for i in 0..1000 {
        let mut images = vec![big.clone()];
        if i >= 990 {
            images.push(other.clone());
        }
        last = store
            .append(&with_images(&format!("s{i}"), images))
            .await
            .unwrap();
    }
    assert_eq!(store.blob_count().unwrap(), 2, "each image once");
    let file = std::fs::metadata(dir.path().join("samples.redb"))
        .unwrap()
        .len();
    assert!(
        file < 40 << 20,
        "a 1 MB image stored once: the file is {file} bytes"
    );
    let back = store.blob(&big.hash).await.unwrap().unwrap();
    assert_eq!(&back[..], big.bytes.as_deref().unwrap(), "byte-identical");
    // The sample carries the reference, not the bytes.
    let read = store.read(0, 1).await.unwrap();
    assert_eq!(read[0].sample.images.len(), 1);
    assert_eq!(read[0].sample.images[0].hash, big.hash);
    assert_eq!(read[0].sample.images[0].bytes, None);

    // Committed up to the samples that still reference `other`: both kept while one does.
    store.commit(last - 10).await.unwrap();
    assert_eq!(store.blob_count().unwrap(), 2);
    store.commit(last - 1).await.unwrap();
    assert!(store.blob(&big.hash).await.unwrap().is_some());
    store.commit(last).await.unwrap();
    assert_eq!(
        store.blob_count().unwrap(),
        0,
        "no kept sample references them"
    );
    assert_eq!(store.blob(&big.hash).await.unwrap(), None);
    assert_eq!(SampleLog::blob(&store, &other.hash).await.unwrap(), None);
}

#[tokio::test]
async fn images_of_stored_samples_survive_a_reopen_and_retention_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(3, 40_000);
    {
        let store = SampleStore::open(config(dir.path(), 1, 64)).unwrap();
        store
            .append(&with_images("a", vec![img.clone()]))
            .await
            .unwrap();
        store
            .append(&with_images("b", vec![img.clone()]))
            .await
            .unwrap();
        // Committed, but the last one retained: its image stays.
        store.commit(2).await.unwrap();
        store.close().await.unwrap();
    }
    let store = SampleStore::open(config(dir.path(), 1, 64)).unwrap();
    assert_eq!(
        store.blob(&img.hash).await.unwrap().as_deref(),
        img.bytes.as_deref()
    );
    store.append(&sample("c")).await.unwrap();
    store.commit(3).await.unwrap();
    assert_eq!(
        store.blob(&img.hash).await.unwrap(),
        None,
        "its last sample compacted"
    );
}

#[tokio::test]
async fn a_sample_whose_image_has_no_bytes_and_is_not_kept_is_refused_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(config(dir.path(), 0, 1)).unwrap();
    let kept = image(1, 100);
    store
        .append(&with_images("a", vec![kept.clone()]))
        .await
        .unwrap();
    // Known hash without bytes: referenced.
    let known = SampleImage {
        bytes: None,
        ..kept.clone()
    };
    let seq = store.append(&with_images("b", vec![known])).await.unwrap();
    assert_eq!(seq, 2);
    // Unknown hash without bytes: refused, with the hash named.
    let unknown = SampleImage {
        bytes: None,
        ..image(2, 100)
    };
    let err = store
        .append(&with_images("c", vec![unknown.clone()]))
        .await
        .unwrap_err();
    let chain = ps_core::error_chain(&err);
    assert!(chain.contains(&unknown.hash), "{chain}");
    // The refused sample took no seq; the next one is stored.
    assert_eq!(store.append(&sample("d")).await.unwrap(), 3);
    assert_eq!(store.read(0, 10).await.unwrap().len(), 3);
}
