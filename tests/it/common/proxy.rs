//! A TCP proxy a test can disturb: block, hold and release, delay.

use super::*;

/// A TCP proxy in front of a server that a test can disturb:
/// - `block`: closes every connection and refuses new ones (accepts and
///   drops them) until `unblock`;
/// - `hold`: keeps what clients send in transit (read from the client, not
///   yet delivered) until `release`, which delivers it in order even if the
///   client has hung up meanwhile: bytes already on the wire arrive late;
/// - `set_latency`: delays every chunk, both ways, by a fixed time plus a
///   random extra up to a jitter, keeping the order.
pub struct FaultProxy {
    pub port: u16,
    state: std::sync::Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    blocked: std::sync::atomic::AtomicBool,
    generation: std::sync::atomic::AtomicU64,
    held: std::sync::atomic::AtomicBool,
    released: tokio::sync::Notify,
    /// (latency, jitter) in ms.
    latency: std::sync::Mutex<(u64, u64)>,
}

impl ProxyState {
    fn delay(&self) -> Duration {
        let (fixed, jitter) = *self.latency.lock().unwrap();
        let extra = if jitter > 0 { rand_below(jitter) } else { 0 };
        Duration::from_millis(fixed + extra)
    }
}

/// A small pseudo-random number (no extra dependency for the tests).
fn rand_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() % n.max(1)
}

impl FaultProxy {
    pub async fn start(target_port: u16) -> FaultProxy {
        let lo = std::net::Ipv4Addr::LOCALHOST;
        Self::start_at(lo.into(), (lo, target_port).into()).await
    }

    /// A proxy listening on `bind` (port 0) in front of `target`.
    pub async fn start_at(bind: std::net::IpAddr, target: std::net::SocketAddr) -> FaultProxy {
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind((bind, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(ProxyState::default());
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if st.blocked.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let st = st.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let my_gen = st.generation.load(Ordering::SeqCst);
                    let (in_r, in_w) = inbound.into_split();
                    let (out_r, out_w) = outbound.into_split();
                    let up = pump(in_r, out_w, st.clone(), true);
                    let down = pump(out_r, in_w, st.clone(), false);
                    let cut = async {
                        while st.generation.load(Ordering::SeqCst) == my_gen {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    };
                    tokio::select! {
                        _ = async { tokio::join!(up, down) } => {}
                        _ = cut => {}
                    }
                });
            }
        });
        FaultProxy { port, state, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Cuts every open connection and refuses new ones until `unblock`.
    pub fn block(&self) {
        self.state.blocked.store(true, Ordering::SeqCst);
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn unblock(&self) {
        self.state.blocked.store(false, Ordering::SeqCst);
    }

    /// Keeps everything clients send from now on in transit until `release`.
    pub fn hold(&self) {
        self.state.held.store(true, Ordering::SeqCst);
    }

    /// Delivers what was held, in order, and lets traffic flow again.
    pub fn release(&self) {
        self.state.held.store(false, Ordering::SeqCst);
        self.state.released.notify_waiters();
    }

    /// Delays every chunk both ways by `fixed` plus up to `jitter`.
    pub fn set_latency(&self, fixed: Duration, jitter: Duration) {
        *self.state.latency.lock().unwrap() = (fixed.as_millis() as u64, jitter.as_millis() as u64);
    }
}

/// Copies one direction of a proxied connection: a reader queues chunks
/// with the time they may go; the writer sends them in order (holding the
/// client-to-server direction while the proxy is held). What was read before
/// the source hung up is still delivered.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    st: std::sync::Arc<ProxyState>,
    upstream: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = {
        let st = st.clone();
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send((Instant::now() + st.delay(), buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                }
            }
        }
    };
    let writer = async move {
        let mut last = Instant::now();
        while let Some((at, chunk)) = rx.recv().await {
            // Order is kept even when a later chunk drew a shorter delay.
            let at = at.max(last);
            last = at;
            tokio::time::sleep_until(at.into()).await;
            while upstream && st.held.load(Ordering::SeqCst) {
                let released = st.released.notified();
                if !st.held.load(Ordering::SeqCst) {
                    break;
                }
                let _ = tokio::time::timeout(Duration::from_millis(50), released).await;
            }
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }
}
