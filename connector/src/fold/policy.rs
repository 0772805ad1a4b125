//! Fold-time policies, built from the config and passed to every stage: the
//! storage handle (`Graph`) carries none. The ids the fold keeps between
//! folds (`known_ids`) travel with them, for the same reason.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{Config, DeletePolicy, EndpointPolicy, Tolerance};
use crate::known_ids::KnownIds;

/// The fold-time policies of the config, per graph type.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    pub tolerance: Tolerance,
    /// Per edge type.
    pub max_pending_edges: usize,
    pub types: HashMap<String, TypePolicy>,
    /// The ids the fold keeps between folds, bounded by
    /// `fold.known_ids_max` (shared by clones: every fold of one loop, or
    /// of one test harness, fills and moves the same sets).
    pub(crate) known_ids: Arc<KnownIds>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct TypePolicy {
    pub endpoint: EndpointPolicy,
    pub deadline_ms: i64,
    pub delete: DeletePolicy,
}

impl Policies {
    pub fn from_config(config: &Config) -> Policies {
        let types = config
            .mappings
            .iter()
            .map(|m| {
                (
                    m.type_name().to_string(),
                    TypePolicy {
                        endpoint: m.on_missing_endpoint,
                        deadline_ms: m.endpoint_deadline.as_millis() as i64,
                        delete: m.on_delete_referenced,
                    },
                )
            })
            .collect();
        Policies {
            tolerance: config.errors.tolerance,
            max_pending_edges: config.errors.max_pending_edges,
            types,
            known_ids: Arc::new(KnownIds::new(config.fold.known_ids_max)),
        }
    }

    /// The policies of a fold that other members' unflushed rows may miss
    /// (partition sharding: each member flushes its shards once per fold
    /// interval). `on_missing_endpoint = "reject"` then defers for `grace`
    /// first, so an edge whose endpoint another member holds in memory is
    /// not refused early; still missing after `grace`, it is refused with
    /// the same code.
    pub(crate) fn deferring_rejects(&self, grace: std::time::Duration) -> Policies {
        let mut p = self.clone();
        for t in p.types.values_mut() {
            if t.endpoint == EndpointPolicy::Reject {
                t.endpoint = EndpointPolicy::Defer;
                t.deadline_ms = grace.as_millis() as i64;
            }
        }
        p
    }

    /// A type's policy; a type no mapping names gets the defaults.
    pub(crate) fn of(&self, ty: &str) -> TypePolicy {
        self.types.get(ty).copied().unwrap_or(TypePolicy {
            deadline_ms: 600_000,
            ..Default::default()
        })
    }
}
