// @sequencer-im/client: a Node.js client of the sequencer (docs/CLIENTS.md).
export {
  SequencerClient,
  newClientMsgId,
  MAX_BATCH_ITEMS,
  MAX_READ_STATE_CONVS,
  type ClientOptions,
  type RetryOptions,
  type TlsOptions,
  type SendInput,
  type SendResult,
  type SendOutcome,
  type Message,
  type MessageKindName,
  type EventInput,
  type EditInput,
  type PullResult,
  type ReadState,
  type ReadPosition,
  type CallOptions,
  type Route,
} from "./client.js";
export { SequencerError, type ErrorCode } from "./errors.js";
export { jsonReplacer, toJSON } from "./json.js";
export { SUBSCRIBE_IDLE_MS, type Cursor, type FeedEvent, type ReadPositionChanged, type SubscribeOptions } from "./feed.js";
// The generated API, for callers who want the raw RPCs.
export * as pb from "./gen/sequencer/v1/sequencer_pb.js";
