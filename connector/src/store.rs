//! How a graph root's object store is reached: the configured Lance storage
//! options, and one store registry shared by every open of the root, so all
//! tables, shards and generations reuse one client (connection pool,
//! resolved credentials) instead of building one per open. A local root
//! needs no options; the same code serves `s3://`, `gs://` and `az://`.

use std::collections::HashMap;
use std::sync::Arc;

use lance::dataset::builder::DatasetBuilder;
use lance::dataset::{WriteMode, WriteParams};
use lance::io::{ObjectStore, ObjectStoreParams, ObjectStoreRegistry, StorageOptionsAccessor};
use lance::session::Session;
use lance::Dataset;

use crate::config::StorageOptions;

#[derive(Clone)]
pub struct Store {
    options: Arc<HashMap<String, String>>,
    registry: Arc<ObjectStoreRegistry>,
}

impl Default for Store {
    fn default() -> Self {
        Store::new(&StorageOptions::default())
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = StorageOptions(
            self.options
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        f.debug_struct("Store").field("options", &shown).finish()
    }
}

impl Store {
    pub fn new(options: &StorageOptions) -> Store {
        Store {
            options: Arc::new(options.0.clone().into_iter().collect()),
            registry: Arc::new(ObjectStoreRegistry::default()),
        }
    }

    /// The options as Lance takes them (for readers outside graphsink that
    /// open the same root, e.g. tests reading with plain Lance).
    pub fn options(&self) -> &HashMap<String, String> {
        &self.options
    }

    /// A session per open keeps Lance's caches per handle, as before, while
    /// the registry (and so the client) is shared.
    fn session(&self) -> Arc<Session> {
        Arc::new(Session::new(
            lance::dataset::DEFAULT_INDEX_CACHE_SIZE,
            lance::dataset::DEFAULT_METADATA_CACHE_SIZE,
            self.registry.clone(),
        ))
    }

    fn params(&self) -> ObjectStoreParams {
        ObjectStoreParams {
            storage_options_accessor: Some(Arc::new(StorageOptionsAccessor::with_static_options(
                (*self.options).clone(),
            ))),
            ..Default::default()
        }
    }

    /// The store holding the single object at `uri`, and its path there.
    async fn object(
        &self,
        uri: &str,
    ) -> lance::Result<(Arc<ObjectStore>, object_store::path::Path)> {
        ObjectStore::from_uri_and_params(self.registry.clone(), uri, &self.params()).await
    }

    /// Opens the latest version of the dataset at `uri`.
    pub async fn open(&self, uri: &str) -> lance::Result<Dataset> {
        DatasetBuilder::from_uri(uri)
            .with_store_params(self.params())
            .with_session(self.session())
            .load()
            .await
    }

    /// Creates the object at `uri` holding `content` unless it exists:
    /// `true` when this call created it. Atomic on every backend (a local
    /// no-clobber create, an S3 conditional PUT), so exactly one of several
    /// racing callers gets `true`.
    pub async fn create_if_absent(&self, uri: &str, content: &[u8]) -> lance::Result<bool> {
        let (store, path) = self.object(uri).await?;
        let create = object_store::PutOptions {
            mode: object_store::PutMode::Create,
            ..Default::default()
        };
        match store
            .inner
            .put_opts(&path, content.to_vec().into(), create)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `content` to the object at `uri`, replacing it.
    pub async fn put(&self, uri: &str, content: &[u8]) -> lance::Result<()> {
        let (store, path) = self.object(uri).await?;
        object_store::ObjectStoreExt::put(store.inner.as_ref(), &path, content.to_vec().into())
            .await?;
        Ok(())
    }

    /// The object at `uri`; `None` if it does not exist.
    pub async fn get(&self, uri: &str) -> lance::Result<Option<Vec<u8>>> {
        let (store, path) = self.object(uri).await?;
        match object_store::ObjectStoreExt::get(store.inner.as_ref(), &path).await {
            Ok(got) => Ok(Some(got.bytes().await?.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// How long ago the object at `uri` was last written; `None` if it does
    /// not exist.
    pub async fn age(&self, uri: &str) -> lance::Result<Option<std::time::Duration>> {
        let (store, path) = self.object(uri).await?;
        match object_store::ObjectStoreExt::head(store.inner.as_ref(), &path).await {
            Ok(meta) => {
                let age = chrono::Utc::now().signed_duration_since(meta.last_modified);
                Ok(Some(age.to_std().unwrap_or_default()))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Write parameters that reach the same store.
    pub fn write_params(&self, mode: WriteMode) -> WriteParams {
        WriteParams {
            mode,
            store_params: Some(self.params()),
            session: Some(self.session()),
            ..Default::default()
        }
    }
}
