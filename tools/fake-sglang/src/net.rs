//! A listener whose connections a handler can kill, so [`crate::Fault::Refuse`] can drop a connection
//! without sending any HTTP answer.
//!
//! Each accepted connection carries a kill switch; the router sees it as the `ConnectInfo<ConnKill>`
//! request extension. Once the switch is set, the socket is reset (zero linger) and every later read or
//! write fails, so hyper abandons the connection before writing a response head.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    extract::connect_info::Connected,
    serve::{IncomingStream, Listener},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
};

/// TCP listener that hands out [`KillableIo`] connections.
pub(crate) struct FakeListener(pub(crate) TcpListener);

impl Listener for FakeListener {
    type Io = KillableIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    // Latency matters more than throughput for a test server.
                    let _ = stream.set_nodelay(true);
                    return (
                        KillableIo {
                            inner: stream,
                            killed: Arc::new(AtomicBool::new(false)),
                        },
                        addr,
                    );
                }
                Err(e) => {
                    tracing::debug!(error = %e, "fake-sglang accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A TCP stream that starts failing every operation once killed.
pub(crate) struct KillableIo {
    inner: TcpStream,
    killed: Arc<AtomicBool>,
}

impl KillableIo {
    fn check(&self) -> io::Result<()> {
        if self.killed.load(Ordering::Acquire) {
            // Reset instead of a clean FIN when the socket is dropped.
            let _ = self.inner.set_zero_linger();
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "fake-sglang fault: connection dropped",
            ))
        } else {
            Ok(())
        }
    }
}

impl AsyncRead for KillableIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(e) = this.check() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The kill switch of the connection a request arrived on.
#[derive(Clone)]
pub(crate) struct ConnKill(Arc<AtomicBool>);

impl ConnKill {
    pub(crate) fn kill(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Connected<IncomingStream<'_, FakeListener>> for ConnKill {
    fn connect_info(stream: IncomingStream<'_, FakeListener>) -> Self {
        ConnKill(stream.io().killed.clone())
    }
}
