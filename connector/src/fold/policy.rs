//! Fold-time policies, built from the config and passed to every stage: the
//! storage handle (`Graph`) carries none.

use std::collections::HashMap;

use crate::config::{Config, DeletePolicy, EndpointPolicy, Tolerance};

/// The fold-time policies of the config, per graph type.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    pub tolerance: Tolerance,
    /// Per edge type.
    pub max_pending_edges: usize,
    pub types: HashMap<String, TypePolicy>,
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
        }
    }

    /// A type's policy; a type no mapping names gets the defaults.
    pub(crate) fn of(&self, ty: &str) -> TypePolicy {
        self.types.get(ty).copied().unwrap_or(TypePolicy {
            deadline_ms: 600_000,
            ..Default::default()
        })
    }
}
