//! The store's settings, gathered from the sections of the server's that
//! bound it: the store does not know `config`, nor `config` the store, so
//! the node, which knows both, makes one from the other.

use crate::config::{OnFull, ServerConfig};
use crate::store::{Full, StoreConfig};

impl ServerConfig {
    /// The store's own settings, gathered from the sections that bound it.
    pub fn store_config(&self) -> StoreConfig {
        StoreConfig {
            stripes: self.store.stripes,
            max_group: usize::from(self.limits.max_group),
            max_log_entries: self.store.max_log_entries,
            max_memory: self.store.max_memory,
            on_full: match self.store.on_full {
                OnFull::Evict => Full::Evict,
                OnFull::Refuse => Full::Refuse,
            },
            change_buffer_cap: self.replication.repl_buffer_cap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_defaults_are_the_stores() {
        let config = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
        let built = config.store_config();
        let store = StoreConfig::default();
        assert_eq!(built.stripes, store.stripes);
        assert_eq!(built.max_group, store.max_group);
        assert_eq!(built.max_log_entries, store.max_log_entries);
        assert_eq!(built.change_buffer_cap, store.change_buffer_cap);
        assert_eq!(built.max_memory, store.max_memory);
        assert!(matches!(built.on_full, Full::Evict));
    }

    #[test]
    fn refuse_at_the_cap_reaches_the_store() {
        let mut config = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
        config.store.on_full = OnFull::Refuse;
        config.store.max_memory = Some(1 << 20);
        let built = config.store_config();
        assert!(matches!(built.on_full, Full::Refuse));
        assert_eq!(built.max_memory, Some(1 << 20));
    }
}
