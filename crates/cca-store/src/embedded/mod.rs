//! Embedded backend (being written).
use crate::error::{Result, StoreError};
#[derive(Clone, Debug)]
pub struct Config {
    pub dir: std::path::PathBuf,
}
impl Config {
    pub fn new(dir: impl Into<std::path::PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
}
#[derive(Debug)]
pub struct EmbeddedStore;
impl EmbeddedStore {
    pub async fn open(_config: Config) -> Result<EmbeddedStore> {
        Err(StoreError::Closed)
    }
}
