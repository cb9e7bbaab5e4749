//! TEMPORARY placeholder until the real file lands.
use super::*;
use std::collections::BTreeMap;
pub struct ExecHandler;
impl ExecHandler { pub fn new(_c: &[String], _e: &BTreeMap<String,String>) -> ExecHandler { ExecHandler } }
#[async_trait]
impl Handler for ExecHandler { async fn handle(&self, _job: &JobContext) -> HandlerResult { Err(JobError::retry("todo")) } }
