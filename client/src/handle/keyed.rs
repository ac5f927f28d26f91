//! Requests over keys only a primary serves, RESET and RELEASE: in cluster
//! mode their keys are split per shard (one request each, counts summed),
//! and a MOVED answer refreshes the slot map and resends that part once.

use std::sync::Arc;

use bytes::Bytes;
use tollgate_protocol::{LeaseRef, Request, Response};

use super::route::Route;
use super::Client;
use crate::calls;
use crate::connection::{response_name, Deadline};
use crate::error::Error;
use crate::shard::{Shard, Wait};

/// How one keyed request is made from its items.
struct Keyed<T> {
    key: fn(&T) -> &Bytes,
    request: fn(Vec<T>) -> Request,
    name: &'static str,
}

impl Client {
    /// Releases the concurrency lease `lease` acquired on `key` (the id in
    /// the allowed [`Decision::lease`](crate::Decision::lease)). Returns
    /// whether it was still held: `false` when it had already been released
    /// or had expired.
    pub async fn release(&self, key: impl Into<Bytes>, lease: u64) -> Result<bool, Error> {
        let released = self
            .release_many(vec![LeaseRef {
                key: key.into(),
                lease,
            }])
            .await?;
        Ok(released > 0)
    }

    /// Releases several leases in one request (per shard, in cluster mode);
    /// returns how many were still held.
    pub async fn release_many(&self, leases: Vec<LeaseRef>) -> Result<u32, Error> {
        let keyed = Keyed {
            key: |l: &LeaseRef| &l.key,
            request: Request::Release,
            name: "RELEASE",
        };
        self.keyed(leases, &keyed).await
    }

    /// Forgets the state of `keys` (per shard, in cluster mode); returns
    /// how many held state.
    pub async fn reset(&self, keys: Vec<Bytes>) -> Result<u32, Error> {
        let keyed = Keyed {
            key: |k: &Bytes| k,
            request: Request::Reset,
            name: "RESET",
        };
        self.keyed(keys, &keyed).await
    }

    async fn keyed<T: Clone>(&self, items: Vec<T>, keyed: &Keyed<T>) -> Result<u32, Error> {
        if items.is_empty() {
            return Ok(0);
        }
        let deadline = Deadline::after(self.deadline);
        let Route::Cluster(cluster) = &self.inner.route else {
            return part(&self.inner.shard, items, keyed, deadline).await;
        };
        let mut total = 0;
        let mut todo = items;
        let mut refreshed = false;
        while !todo.is_empty() {
            let mut parts: Vec<(Arc<Shard>, Vec<T>)> = Vec::new();
            for item in todo.drain(..) {
                let shard = cluster.shard_for((keyed.key)(&item), deadline).await?;
                match parts.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &shard)) {
                    Some((_, members)) => members.push(item),
                    None => parts.push((shard, vec![item])),
                }
            }
            let mut moved = None;
            for (shard, items) in parts {
                // Kept for a resend (cheap handles): nothing of a request
                // answered MOVED was applied.
                let kept = items.clone();
                match part(&shard, items, keyed, deadline).await {
                    Ok(n) => total += n,
                    Err(Error::Moved { slot, addr }) if !refreshed => {
                        moved.get_or_insert((slot, addr));
                        todo.extend(kept);
                    }
                    Err(e) => return Err(e),
                }
            }
            if let Some((slot, addr)) = moved {
                tracing::debug!(slot, %addr, request = keyed.name, "MOVED: refreshing the slot map");
                refreshed = true;
                cluster.refresh(deadline).await?;
            }
        }
        Ok(total)
    }
}

/// One request of `items` to `shard`'s primary.
async fn part<T>(
    shard: &Arc<Shard>,
    items: Vec<T>,
    keyed: &Keyed<T>,
    deadline: Deadline,
) -> Result<u32, Error> {
    let conn = shard.connection(Wait::Until(deadline)).await?;
    calls::check_keys(items.iter().map(keyed.key), &conn.info().limits)?;
    match calls::primary(shard, conn, (keyed.request)(items), deadline).await? {
        Response::Released(n) | Response::ResetDone(n) => Ok(n),
        Response::Error { code, message } => Err(Error::Server { code, message }),
        Response::Moved(m) => Err(Error::Moved {
            slot: m.slot,
            addr: m.addr,
        }),
        other => Err(Error::UnexpectedResponse {
            request: keyed.name,
            got: response_name(&other),
        }),
    }
}
