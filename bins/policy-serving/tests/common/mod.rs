//! What the black-box tests of the binary share: a child process that is killed when the test
//! ends, and a free loopback port.
#![allow(dead_code, clippy::unwrap_used)]

/// Kills the child when dropped, so a failing assertion never leaves a server running.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
