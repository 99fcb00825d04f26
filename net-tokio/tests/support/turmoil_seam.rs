//! The shell's network seam over turmoil's simulated TCP, so the real servers and clients of
//! `dart-net-tokio` run inside a deterministic simulation.
//!
//! Test-only on purpose: turmoil stays out of the production dependency graph, and a test file
//! needs no cargo feature, so `cargo test --workspace` compiles and runs it with no flags.

use dart_net_tokio::seam::{Dialer, Listener};
use std::io;
use std::net::SocketAddr;

/// Accepts simulated TCP connections.
pub struct TurmoilListener(pub turmoil::net::TcpListener);

impl TurmoilListener {
    /// Binds `0.0.0.0:port` on the current simulated host.
    pub async fn bind(port: u16) -> io::Result<Self> {
        let l = turmoil::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).await?;
        Ok(TurmoilListener(l))
    }
}

impl Listener for TurmoilListener {
    type Io = turmoil::net::TcpStream;

    async fn accept(&mut self) -> io::Result<(Self::Io, SocketAddr)> {
        self.0.accept().await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// Dials simulated hosts by name through turmoil's DNS.
#[derive(Clone, Copy, Debug, Default)]
pub struct TurmoilDialer;

impl Dialer for TurmoilDialer {
    type Io = turmoil::net::TcpStream;

    async fn dial(&self, host: &str, port: u16) -> io::Result<Self::Io> {
        turmoil::net::TcpStream::connect((host, port)).await
    }

    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok(turmoil::net::lookup_host((host, port)).await?.collect())
    }

    async fn dial_addr(&self, addr: SocketAddr) -> io::Result<Self::Io> {
        turmoil::net::TcpStream::connect(addr).await
    }
}

/// The whole seam over turmoil: simulated listeners and dialers, and no wall clock (a `Date`
/// header would read real time).
#[derive(Clone, Copy, Debug, Default)]
#[allow(dead_code)] // each test binary that includes this file uses a subset
pub struct TurmoilSeam;

impl dart_net_tokio::seam::Seam for TurmoilSeam {
    type Listener = TurmoilListener;
    type Dialer = TurmoilDialer;

    async fn bind(&self, addr: SocketAddr) -> io::Result<TurmoilListener> {
        TurmoilListener::bind(addr.port()).await
    }

    fn dialer(&self) -> TurmoilDialer {
        TurmoilDialer
    }

    fn wall_clock(&self) -> bool {
        false
    }
}
