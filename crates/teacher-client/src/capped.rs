//! [`Capped`]: a cap on simultaneous teacher calls. The reference serialises judge votes and teacher
//! calls behind one semaphore of size 1 across all sessions; here the teacher has its own cap
//! (`teacher.max_concurrency`), separate from the judge's.

use std::{num::NonZeroUsize, sync::Arc};

use async_trait::async_trait;
use tokio::sync::Semaphore;

use crate::{
    TeacherLogprobs, TeacherScorer,
    error::{MAX_CONCURRENCY_KEY, TeacherError},
};

/// A [`TeacherScorer`] that holds a permit of its semaphore for the whole of each call. The wait for a
/// permit is not part of the call's timeout.
#[derive(Debug, Clone)]
pub struct Capped<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: Option<usize>,
}

impl<S> Capped<S> {
    /// At most `limit` calls of `inner` at once.
    pub fn new(inner: S, limit: NonZeroUsize) -> Self {
        Self {
            inner,
            permits: Arc::new(Semaphore::new(limit.get())),
            limit: Some(limit.get()),
        }
    }

    /// Calls of `inner` share `permits` with whatever else holds it.
    pub fn with_semaphore(inner: S, permits: Arc<Semaphore>) -> Self {
        Self {
            inner,
            permits,
            limit: None,
        }
    }

    /// Permits free now (for metrics and tests).
    pub fn available_permits(&self) -> usize {
        self.permits.available_permits()
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: TeacherScorer> TeacherScorer for Capped<S> {
    async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, TeacherError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| TeacherError::LimiterClosed {
                teacher: self.inner.describe(),
                config_key: MAX_CONCURRENCY_KEY,
            })?;
        self.inner.score(input_ids, response_len, top_k).await
    }

    fn describe(&self) -> String {
        match self.limit {
            Some(n) => format!("{} (at most {n} calls at once)", self.inner.describe()),
            None => format!(
                "{} (calls capped by a shared semaphore)",
                self.inner.describe()
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::MockTeacherScorer;

    #[tokio::test]
    async fn a_closed_limiter_is_an_error_and_describe_names_the_cap() {
        let mut mock = MockTeacherScorer::new();
        mock.expect_describe()
            .return_const("mock teacher".to_owned());
        mock.expect_score().never();
        let sem = Arc::new(Semaphore::new(1));
        let capped = Capped::with_semaphore(mock, sem.clone());
        sem.close();
        let e = capped.score(&[1, 2], 1, 0).await.unwrap_err();
        assert!(matches!(e, TeacherError::LimiterClosed { .. }), "{e}");
        assert!(e.to_string().contains("mock teacher"), "{e}");
        assert!(capped.describe().contains("shared semaphore"));
    }

    #[tokio::test]
    async fn calls_go_through_with_a_permit() {
        let mut mock = MockTeacherScorer::new();
        mock.expect_describe().return_const("m".to_owned());
        mock.expect_score()
            .withf(|ids, t, k| ids == [1, 2, 3] && *t == 2 && *k == 0)
            .times(1)
            .returning(|_, _, _| {
                Ok(TeacherLogprobs {
                    log_probs: vec![-0.1, -0.2],
                    topk_log_probs: None,
                    topk_indices: None,
                    echoed_ids: vec![2, 3],
                    echo_verified: true,
                })
            });
        let capped = Capped::new(mock, NonZeroUsize::new(2).unwrap());
        assert_eq!(capped.describe(), "m (at most 2 calls at once)");
        let r = capped.score(&[1, 2, 3], 2, 0).await.unwrap();
        assert_eq!(r.check_alignment(&[2, 3]), Ok(()));
        assert_eq!(capped.available_permits(), 2);
    }
}
