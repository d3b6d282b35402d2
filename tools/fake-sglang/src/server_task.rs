//! The background task serving a fake, shared by [`crate::FakeHandle`] and
//! [`crate::FakeProviderHandle`]: a graceful stop on `shutdown`, an abort on drop.

use tokio::{sync::oneshot, task::JoinHandle};

pub(crate) struct ServerTask {
    name: &'static str,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl ServerTask {
    pub(crate) fn new(
        name: &'static str,
        stop: oneshot::Sender<()>,
        task: JoinHandle<std::io::Result<()>>,
    ) -> Self {
        Self {
            name,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops accepting and waits for in-flight requests to finish.
    pub(crate) async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "{} server failed", self.name),
                Err(e) => tracing::warn!(error = %e, "{} server task failed", self.name),
            }
        }
    }
}

impl Drop for ServerTask {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
