//! etcd backend (being written).
use crate::error::{Result, StoreError};

#[derive(Clone, Debug)]
pub struct Config {
    pub endpoints: Vec<String>,
}
impl Config {
    pub fn new(endpoints: Vec<String>) -> Self {
        Self { endpoints }
    }
}
#[derive(Debug)]
pub struct EtcdStore;
impl EtcdStore {
    pub async fn connect(_config: Config) -> Result<crate::embedded::EmbeddedStore> {
        Err(StoreError::Closed)
    }
}
