// @jobwarden/client: a thin producer for jobwarden. Publish a job to NATS JetStream
// (Producer.publish) or enqueue it through PostgreSQL inside your own transaction (enqueue,
// enqueueMany). Both check the job against the contract of docs/message.schema.json first.
export { Producer, buildMessage, checkSubjectPrefix } from "./producer.js";
export type { JobFields, Message, ProducerOptions, PublishOptions, Published } from "./producer.js";
export { enqueue, enqueueMany, buildEnqueue } from "./sql.js";
export type { BulkJob, EnqueueOptions, JobSpecFields, Queryable } from "./sql.js";
export { InvalidJobError, JobwardenError, checkEnvelope, isTraceparent, newJobId } from "./contract.js";
export type * from "./envelope.generated.js";
