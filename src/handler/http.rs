//! TEMPORARY placeholder until the real file lands.
use super::*;
pub struct HttpHandler;
impl HttpHandler { pub fn new(_url: &str) -> HttpHandler { HttpHandler } }
#[async_trait]
impl Handler for HttpHandler { async fn handle(&self, _job: &JobContext) -> HandlerResult { Err(JobError::retry("todo")) } }
