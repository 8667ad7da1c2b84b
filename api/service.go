// Package api is the sequencer's RPC edge: it owns request validation
// (docs/API.md, "Validation"), the mapping of domain error codes to Connect
// statuses (status.go, the only such place), the Connect handler of
// sequencer.v1.SequencerService, the guards in front of it (bearer tokens,
// request size, CORS: http.go, auth.go) and the admin endpoints /healthz,
// /readyz and /metrics (on the API port or their own).
//
// It must never assign seqs or msg_ids, decide ownership, or talk to a store
// or the actor system directly: it validates, calls the small interfaces
// below (Sender, Reader, Router, ReadPositions), and translates their answers. A request
// that fails validation never reaches the Sender, so it consumes no seq.
package api

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer/internal/tracing"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// Sender stores a validated message and answers only after the durable
// commit (the conversations of this node: actor.Conversations). Its errors carry sequencer Codes.
type Sender interface {
	Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error)
	// SendBatch stores every request independently, as Send would, and
	// writes the answer of reqs[i] to out[i] (len(out) == len(reqs)). Requests
	// of one conversation get increasing seqs in slice order (when both
	// succeed). It returns when every item is answered.
	SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome)
}

// Reader answers the read RPCs. persist.Store satisfies it.
type Reader = persist.Reader

// ReadPositions stores users' read positions (persist.ReadPositions: every
// store has them). They need no single writer, so the node that got the
// request calls its store directly, never the conversation's owner: a
// position only moves up (GREATEST in the store, in one statement with the
// head clamp), so two nodes writing one position during a handoff, or a
// stale owner after a failover, can only leave the higher of their marks,
// never a lower one. Its errors carry sequencer Codes.
type ReadPositions interface {
	MarkRead(ctx context.Context, convID string, uid, seq uint64) (sequencer.ReadState, error)
	ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]sequencer.ReadState, error)
	// ReadCounts and ReadPositionsPage answer GetReadReceipts and
	// ListReadPositions (persist.ReadPositions).
	ReadCounts(ctx context.Context, convID string, bounds []uint64) ([]uint64, error)
	ReadPositionsPage(ctx context.Context, convID string, afterUID uint64, limit int) ([]persist.ReadPosition, bool, error)
}

// Router tells which node owns a conversation now.
type Router interface {
	Route(ctx context.Context, convID string) (sequencer.Route, error)
}

// MembershipViewer is an optional ability of a Router (cluster.Node has
// it): the version of the membership view the node routes by. With it, every
// answer to Send and SendBatch carries that version in the response header
// HeaderMembershipVersion.
type MembershipViewer interface {
	MembershipVersion() uint64
}

// HeaderMembershipVersion names the membership version of the node that
// answered a Send or SendBatch (cluster mode). A client that caches the
// owners Route named (the SDKs, docs/CLIENTS.md) asks Route again before
// it uses an owner learned under an older version: the ring may have moved
// it, and a send that a non-owner forwards succeeds without telling.
const HeaderMembershipVersion = "Sequencer-Membership-Version"

// RouterFunc adapts a function to Router.
type RouterFunc func(ctx context.Context, convID string) (sequencer.Route, error)

// Route calls f.
func (f RouterFunc) Route(ctx context.Context, convID string) (sequencer.Route, error) {
	return f(ctx, convID)
}

// Config wires a Service. DefaultConfig holds every default; a zero field
// in the Config given to NewService means its default.
type Config struct {
	// Sender handles Send. Required.
	Sender Sender
	// Reader handles Pull, GetHead and GetMessage. Required.
	Reader Reader
	// Router handles Route. Optional: nil answers Route with unimplemented.
	Router Router
	// Positions handles MarkRead, GetReadState, GetReadReceipts and
	// ListReadPositions. Optional: nil answers them with unimplemented.
	Positions ReadPositions
	// Feed serves Subscribe (package feed; its backlog is read from
	// Reader). Optional: nil answers Subscribe with unimplemented.
	Feed *feed.Hub
	// MaxBody is the largest Send body in bytes (1 B..64 MiB).
	MaxBody int
	// MaxBatchBytes is the largest SendBatch request (its protobuf size;
	// 1 KiB..64 MiB).
	MaxBatchBytes int
	// Metrics records sequencer_rpc_requests_total{method,code},
	// sequencer_sends_total{code} and sequencer_dedup_hits_total. Optional.
	Metrics *metrics.Set
	// Logger logs internal errors (and retryable ones at debug level).
	// Default: slog.Default().
	Logger *slog.Logger
	// TracerProvider, when set, traces every RPC (OpenTelemetry, through
	// connectrpc.com/otelconnect); a caller's trace context is linked, not
	// trusted as parent. nil: no tracing, no interceptor.
	TracerProvider trace.TracerProvider
}

// Service implements sequencerv1connect.SequencerServiceHandler.
type Service struct {
	sender   Sender
	reader   Reader
	router   Router
	viewer   MembershipViewer // the Router's, if it has one
	reads    ReadPositions
	feed     *feed.Hub
	maxBody  int
	maxBatch int
	metrics  *metrics.Set
	log      *slog.Logger
	tracer   trace.TracerProvider
	hot      hotMetrics // the series of successful sends, resolved once
}

var (
	_ sequencerv1connect.SequencerServiceHandler = (*Service)(nil)
)

// Method names as they appear in the metric label "method".
const (
	methodSend       = "Send"
	methodPull       = "Pull"
	methodGetHead    = "GetHead"
	methodGetMessage = "GetMessage"
	methodRoute      = "Route"
	methodSendBatch  = "SendBatch"
	methodMarkRead   = "MarkRead"
	methodReadState  = "GetReadState"
	methodReceipts   = "GetReadReceipts"
	methodPositions  = "ListReadPositions"
)

// MaxBatchItems is the most items one SendBatch may hold.
const MaxBatchItems = 1000

// Bounds of Config's limits.
const (
	maxMaxBody       = 64 << 20
	minMaxBatchBytes = 1 << 10
	maxMaxBatchBytes = 64 << 20
)

// DefaultConfig returns every default (Sender and Reader are still
// required).
func DefaultConfig() Config {
	return Config{
		MaxBody:       sequencer.DefaultMaxBody,
		MaxBatchBytes: 4 << 20,
	}
}

// Validate reports every field that makes no sense, as given (zero limits
// too: NewService fills them from DefaultConfig first).
func (c Config) Validate() error {
	ch := conf.Checker{Pkg: "api"}
	conf.Range(&ch, "MaxBody", c.MaxBody, 1, maxMaxBody)
	conf.Range(&ch, "MaxBatchBytes", c.MaxBatchBytes, minMaxBatchBytes, maxMaxBatchBytes)
	return ch.Err()
}

// NewService builds the service. Zero fields take their DefaultConfig
// value. It panics if cfg.Sender or cfg.Reader is nil or cfg does not
// validate (a wiring bug, not a runtime condition: server validates its
// flags first).
func NewService(cfg Config) *Service {
	if cfg.Sender == nil {
		panic("api: Config.Sender is required")
	}
	if cfg.Reader == nil {
		panic("api: Config.Reader is required")
	}
	conf.FillZero(&cfg, DefaultConfig())
	if err := cfg.Validate(); err != nil {
		panic(err.Error())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	viewer, _ := cfg.Router.(MembershipViewer)
	return &Service{
		viewer:   viewer,
		maxBatch: cfg.MaxBatchBytes,
		sender:   cfg.Sender,
		reader:   cfg.Reader,
		router:   cfg.Router,
		reads:    cfg.Positions,
		feed:     cfg.Feed,
		maxBody:  cfg.MaxBody,
		metrics:  cfg.Metrics,
		log:      cfg.Logger,
		tracer:   cfg.TracerProvider,
	}
}

// compressMinBytes is the smallest response the handler compresses when the
// client accepts it.
const compressMinBytes = 1024

// gzipLevel is the level of the responses the handler gzips.
const gzipLevel = gzip.BestSpeed

// ReadMaxBytes is the largest request message the handler reads by default:
// room for a maximal Send body or a maximal SendBatch in base64 JSON (4/3)
// with a wide margin, so an oversized body or batch is answered
// invalid_argument by validation. Requests beyond this are refused, also
// invalid_argument, by NewAPIMux's size guard before anything is decoded.
func (s *Service) ReadMaxBytes() int { return max(4*s.maxBody, 2*s.maxBatch) + 64<<10 }

// Handler returns the path to mount and the Connect handler (gRPC, gRPC-Web
// and Connect, binary and JSON). Defaults: WithReadMaxBytes(ReadMaxBytes()),
// WithCompressMinBytes(1 KiB), a recover that answers internal and logs
// the panic, the JSON codec of jsoncodec.go (protojson's answers, with a
// direct path for Send) and the binary codec of feedcodec.go (connect's,
// which also writes Subscribe's shared events); opts come after and may
// override them.
func (s *Service) Handler(opts ...connect.HandlerOption) (path string, h http.Handler) {
	base := []connect.HandlerOption{
		connect.WithReadMaxBytes(s.ReadMaxBytes()),
		connect.WithRecover(s.recovered),
		// A SendResponse is a few dozen bytes: gzip costs CPU and saves
		// nothing. Pull pages and messages above 1 KiB still compress.
		connect.WithCompressMinBytes(compressMinBytes),
		// gzip at its fastest level: a PullMany answer (1,000 x 10
		// messages, 2 MB) took 30% of the server's CPU per call at the
		// default level.
		connect.WithCompression("gzip",
			func() connect.Decompressor { return &gzip.Reader{} },
			func() connect.Compressor { w, _ := gzip.NewWriterLevel(io.Discard, gzipLevel); return w }),
	}
	base = append(base, jsonCodecs()...) // a direct path for JSON Sends (jsoncodec.go)
	// Subscribe's live messages encoded once for all streams (feedcodec.go).
	base = append(base, connect.WithCodec(protoCodec{}))
	if ic := tracing.Interceptor(s.tracer, false); ic != nil {
		base = append(base, ic)
	}
	return sequencerv1connect.NewSequencerServiceHandler(s, append(base, opts...)...)
}

// Send validates the request and hands it to the Sender; the answer carries
// the stored message's ids (the first send's on a resend, duplicate: true).
func (s *Service) Send(ctx context.Context, req *connect.Request[sequencerv1.SendRequest]) (*connect.Response[sequencerv1.SendResponse], error) {
	res, err := s.send(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	resp := connect.NewResponse(sendResponse(res))
	s.viewHeader(resp.Header())
	return resp, nil
}

// viewHeader sets HeaderMembershipVersion on a send's answer (cluster mode).
func (s *Service) viewHeader(h http.Header) {
	if s.viewer != nil {
		h[HeaderMembershipVersion] = []string{strconv.FormatUint(s.viewer.MembershipVersion(), 10)}
	}
}

// send is Send but for building the answer's message (the direct JSON path
// writes the result itself): validation, the Sender, metrics and logs, and
// the error for the client.
func (s *Service) send(ctx context.Context, msg *sequencerv1.SendRequest) (_ sequencer.SendResult, err error) {
	dup := false
	defer func(start time.Time) { s.observeSend(ctx, methodSend, start, err, dup) }(time.Now())
	in, err := ValidateSend(msg, s.maxBody)
	if err != nil {
		return sequencer.SendResult{}, s.fail(ctx, methodSend, err)
	}
	res, err := s.sender.Send(ctx, in)
	if err != nil {
		return sequencer.SendResult{}, s.fail(ctx, methodSend, err, "conv_id", in.ConvID, "from_uid", in.FromUID, "client_msg_id", in.ClientMsgID)
	}
	s.ok(methodSend)
	s.countSend(res)
	dup = res.Duplicate
	return res, nil
}

// SendBatch validates every item on its own, hands the valid ones to the
// Sender in item order, and answers results[i] for items[i]. Only the
// request as a whole (no items, more than MaxBatchItems, more than
// MaxBatchBytes) fails the RPC, with invalid_argument.
func (s *Service) SendBatch(ctx context.Context, req *connect.Request[sequencerv1.SendBatchRequest]) (_ *connect.Response[sequencerv1.SendBatchResponse], err error) {
	defer func(start time.Time) { s.observeSend(ctx, methodSendBatch, start, err, false) }(time.Now())
	items := req.Msg.GetItems()
	switch n := len(items); {
	case n == 0:
		return nil, s.fail(ctx, methodSendBatch, sequencer.Errorf(sequencer.CodeInvalidArgument, "items: must hold 1..%d items, got 0", MaxBatchItems))
	case n > MaxBatchItems:
		return nil, s.fail(ctx, methodSendBatch, sequencer.Errorf(sequencer.CodeInvalidArgument, "items: must hold 1..%d items, got %d", MaxBatchItems, n))
	}
	if size := proto.Size(req.Msg); size > s.maxBatch {
		return nil, s.fail(ctx, methodSendBatch, sequencer.Errorf(sequencer.CodeInvalidArgument, "request: must be at most %d bytes, got %d", s.maxBatch, size))
	}
	results := make([]*sequencerv1.SendResult, len(items))
	reqs := make([]sequencer.SendRequest, 0, len(items))
	at := make([]int, 0, len(items)) // reqs[k] answers items[at[k]]
	for i, it := range items {
		in, err := ValidateSend(it, s.maxBody)
		if err != nil {
			results[i] = s.itemError(ctx, err)
			continue
		}
		reqs = append(reqs, in)
		at = append(at, i)
	}
	if len(reqs) > 0 {
		out := make([]sequencer.SendOutcome, len(reqs))
		s.sender.SendBatch(ctx, reqs, out)
		for k, o := range out {
			if o.Err != nil {
				results[at[k]] = s.itemError(ctx, o.Err, "conv_id", reqs[k].ConvID, "from_uid", reqs[k].FromUID, "client_msg_id", reqs[k].ClientMsgID)
				continue
			}
			s.countSend(o.Result)
			results[at[k]] = &sequencerv1.SendResult{Outcome: &sequencerv1.SendResult_Ok{Ok: sendResponse(o.Result)}}
		}
	}
	s.ok(methodSendBatch)
	resp := connect.NewResponse(&sequencerv1.SendBatchResponse{Results: results})
	s.viewHeader(resp.Header())
	return resp, nil
}

// itemError records one failed batch item like a failed Send and returns its
// result, with the code and message a Send would have answered.
func (s *Service) itemError(ctx context.Context, err error, attrs ...any) *sequencerv1.SendResult {
	s.countFailedSend(CodeOf(ctx, err))
	ce := s.logFailure(ctx, methodSendBatch, err, attrs...)
	return &sequencerv1.SendResult{Outcome: &sequencerv1.SendResult_Error{Error: &sequencerv1.SendError{
		Code: ce.Code().String(), Message: ce.Message(),
	}}}
}

func (s *Service) countSend(res sequencer.SendResult) {
	if s.metrics == nil {
		return
	}
	if res.Duplicate {
		s.hot.sendsDup.get(func() prometheus.Counter { return s.metrics.Sends.WithLabelValues("duplicate") }).Inc()
		s.metrics.DedupHits.Inc()
	} else {
		s.hot.sendsOK.get(func() prometheus.Counter { return s.metrics.Sends.WithLabelValues("ok") }).Inc()
	}
}

func sendResponse(res sequencer.SendResult) *sequencerv1.SendResponse {
	return &sequencerv1.SendResponse{MsgId: res.MsgID, Seq: res.Seq, ServerAt: timestamp(res), Duplicate: res.Duplicate}
}

func timestamp(res sequencer.SendResult) *timestamppb.Timestamp {
	if res.ServerAt.IsZero() {
		return nil
	}
	return timestamppb.New(res.ServerAt)
}

// Pull answers the messages with seq > after_seq, ascending, at most limit.
//
// head_seq is the conversation's head (raised to the last returned seq if a
// commit landed between reading the head and the rows). has_more is true
// only when the page is full and its last seq is below head_seq: rows are
// contiguous and retention only deletes a prefix, so every seq after a
// returned row up to the head is still stored and another Pull will return
// it. When retention deleted everything after after_seq, the answer is no
// messages, head_seq > after_seq and has_more false: the client sees the
// gap (seqs it cannot get) instead of looping on a promise of more rows.
func (s *Service) Pull(ctx context.Context, req *connect.Request[sequencerv1.PullRequest]) (*connect.Response[sequencerv1.PullResponse], error) {
	q, err := ValidatePull(req.Msg)
	if err != nil {
		return nil, s.fail(ctx, methodPull, err)
	}
	head, err := s.reader.LoadHead(ctx, q.ConvID)
	if err != nil {
		return nil, s.fail(ctx, methodPull, fmt.Errorf("load head of %q: %w", q.ConvID, err), "conv_id", q.ConvID)
	}
	if q.BeforeSeq > 0 {
		resp, err := s.pullBefore(ctx, q, head)
		if err != nil {
			return nil, s.fail(ctx, methodPull, fmt.Errorf("read %q before seq %d: %w", q.ConvID, q.BeforeSeq, err), "conv_id", q.ConvID)
		}
		s.ok(methodPull)
		return connect.NewResponse(resp), nil
	}
	resp := &sequencerv1.PullResponse{HeadSeq: head}
	// after_seq at or past the head has nothing to read (this also keeps
	// after_seq >= 2^63 away from BIGINT stores).
	if q.AfterSeq < head {
		rows, full, err := s.readPage(ctx, q)
		if err != nil {
			return nil, s.fail(ctx, methodPull, fmt.Errorf("read %q after seq %d: %w", q.ConvID, q.AfterSeq, err), "conv_id", q.ConvID)
		}
		resp.Messages = make([]*sequencerv1.Message, len(rows))
		for i := range rows {
			resp.Messages[i] = messageProto(&rows[i])
		}
		if n := len(rows); n > 0 {
			last := rows[n-1].Seq
			if last > resp.HeadSeq {
				resp.HeadSeq = last
			}
			resp.HasMore = full && last < resp.HeadSeq
		}
	}
	s.ok(methodPull)
	return connect.NewResponse(resp), nil
}

// pullChunk is the most rows Pull reads from the store at once: its memory
// stays near max_bytes plus one chunk even when the rows are large.
const pullChunk = 128

// readPage reads the rows of one Pull page: at most q.Limit rows and, after
// the first, no row that would take the page past q.MaxBytes (messageSize).
// full reports that the page stopped at a limit (rows or bytes) rather than
// at the end of the stored rows.
func (s *Service) readPage(ctx context.Context, q PullQuery) (rows []sequencer.Message, full bool, err error) {
	after, size := q.AfterSeq, 0
	for len(rows) < q.Limit {
		want := min(q.Limit-len(rows), pullChunk)
		chunk, err := s.reader.ReadRange(ctx, q.ConvID, after, want)
		if err != nil {
			return nil, false, err
		}
		for i := range chunk {
			if len(rows) == q.Limit {
				return rows, true, nil
			}
			n := messageSize(&chunk[i])
			if len(rows) > 0 && size+n > q.MaxBytes {
				return rows, true, nil
			}
			rows = append(rows, chunk[i])
			size += n
		}
		if len(chunk) < want {
			return rows, false, nil // the end of the stored rows
		}
		after = chunk[len(chunk)-1].Seq
	}
	return rows, true, nil
}

// messageSize is what a message counts against Pull's max_bytes: its
// variable fields plus a fixed 64 bytes for the numbers and framing.
func messageSize(m *sequencer.Message) int {
	return len(m.Body) + len(m.ConvID) + len(m.ClientMsgID) + 64
}

// GetHead answers the highest committed seq of a conversation (0 if none).
func (s *Service) GetHead(ctx context.Context, req *connect.Request[sequencerv1.GetHeadRequest]) (*connect.Response[sequencerv1.GetHeadResponse], error) {
	convID := req.Msg.GetConvId()
	if err := ValidateConvID(convID); err != nil {
		return nil, s.fail(ctx, methodGetHead, err)
	}
	head, err := s.reader.LoadHead(ctx, convID)
	if err != nil {
		return nil, s.fail(ctx, methodGetHead, fmt.Errorf("load head of %q: %w", convID, err), "conv_id", convID)
	}
	s.ok(methodGetHead)
	return connect.NewResponse(&sequencerv1.GetHeadResponse{HeadSeq: head}), nil
}

// GetMessage answers one message by msg_id, or not_found.
func (s *Service) GetMessage(ctx context.Context, req *connect.Request[sequencerv1.GetMessageRequest]) (*connect.Response[sequencerv1.GetMessageResponse], error) {
	msgID := req.Msg.GetMsgId()
	if err := ValidateMsgID(msgID); err != nil {
		return nil, s.fail(ctx, methodGetMessage, err)
	}
	m, err := s.reader.GetMessage(ctx, msgID)
	if err != nil {
		if CodeOf(ctx, err) == sequencer.CodeNotFound {
			err = sequencer.Errorf(sequencer.CodeNotFound, "msg_id %d: not found", msgID)
		} else {
			err = fmt.Errorf("get msg_id %d: %w", msgID, err)
		}
		return nil, s.fail(ctx, methodGetMessage, err, "msg_id", msgID)
	}
	s.ok(methodGetMessage)
	return connect.NewResponse(&sequencerv1.GetMessageResponse{Message: messageProto(&m)}), nil
}

// errNoRouter answers Route on a node built without a Router.
var errNoRouter = connect.NewError(connect.CodeUnimplemented, errors.New("routing is not configured on this node"))

// Route answers which node owns a conversation now.
func (s *Service) Route(ctx context.Context, req *connect.Request[sequencerv1.RouteRequest]) (*connect.Response[sequencerv1.RouteResponse], error) {
	convID := req.Msg.GetConvId()
	if err := ValidateConvID(convID); err != nil {
		return nil, s.fail(ctx, methodRoute, err)
	}
	if s.router == nil {
		s.count(methodRoute, "unimplemented")
		return nil, errNoRouter
	}
	r, err := s.router.Route(ctx, convID)
	if err != nil {
		return nil, s.fail(ctx, methodRoute, fmt.Errorf("route %q: %w", convID, err), "conv_id", convID)
	}
	s.ok(methodRoute)
	return connect.NewResponse(&sequencerv1.RouteResponse{
		NodeId:            r.NodeID,
		Address:           r.Address,
		Partition:         r.Partition,
		Epoch:             r.Epoch,
		MembershipVersion: r.MembershipVersion,
	}), nil
}

// errNoPositions answers the read-position RPCs on a node built without
// ReadPositions.
var errNoPositions = connect.NewError(connect.CodeUnimplemented, errors.New("read positions are not configured on this node"))

// MarkRead raises uid's read position in conv_id to seq (clamped to the
// head, never backwards) and answers the stored position, the head and the
// unread count. The store decides (see ReadPositions); nothing is stored
// when validation fails. A user's own Send moves their position too, in
// its commit (unless serve --send-marks-read=false; persist.SenderMarks).
// The position stored is published to the feed's read-position streams.
func (s *Service) MarkRead(ctx context.Context, req *connect.Request[sequencerv1.MarkReadRequest]) (*connect.Response[sequencerv1.MarkReadResponse], error) {
	m := req.Msg
	if err := ValidateMarkRead(m); err != nil {
		return nil, s.fail(ctx, methodMarkRead, err)
	}
	if s.reads == nil {
		s.count(methodMarkRead, "unimplemented")
		return nil, errNoPositions
	}
	st, err := s.reads.MarkRead(ctx, m.GetConvId(), m.GetUid(), m.GetSeq())
	if err != nil {
		return nil, s.fail(ctx, methodMarkRead, fmt.Errorf("mark read: %w", err), "conv_id", m.GetConvId(), "uid", m.GetUid())
	}
	if s.feed != nil && st.ReadSeq > 0 {
		s.feed.PublishRead(feed.ReadTick{ConvID: m.GetConvId(), UID: m.GetUid(), ReadSeq: st.ReadSeq})
	}
	s.ok(methodMarkRead)
	return connect.NewResponse(&sequencerv1.MarkReadResponse{ReadSeq: st.ReadSeq, HeadSeq: st.Head, Unread: st.Unread()}), nil
}

// GetReadState answers uid's read state in each of conv_ids (1..1,000), in
// the order given, from one store query.
func (s *Service) GetReadState(ctx context.Context, req *connect.Request[sequencerv1.GetReadStateRequest]) (*connect.Response[sequencerv1.GetReadStateResponse], error) {
	m := req.Msg
	if err := ValidateReadState(m); err != nil {
		return nil, s.fail(ctx, methodReadState, err)
	}
	if s.reads == nil {
		s.count(methodReadState, "unimplemented")
		return nil, errNoPositions
	}
	states, err := s.reads.ReadStates(ctx, m.GetUid(), m.GetConvIds())
	if err != nil {
		return nil, s.fail(ctx, methodReadState, fmt.Errorf("read states: %w", err), "uid", m.GetUid(), "conversations", len(m.GetConvIds()))
	}
	if len(states) != len(m.GetConvIds()) {
		return nil, s.fail(ctx, methodReadState, fmt.Errorf("read states: the store answered %d states for %d conversations", len(states), len(m.GetConvIds())))
	}
	out := make([]*sequencerv1.ReadState, len(states))
	for i, st := range states {
		out[i] = &sequencerv1.ReadState{ConvId: m.GetConvIds()[i], ReadSeq: st.ReadSeq, HeadSeq: st.Head, Unread: st.Unread()}
	}
	s.ok(methodReadState)
	return connect.NewResponse(&sequencerv1.GetReadStateResponse{States: out}), nil
}

// MessageProto is a stored message as the API returns it (and the firehose
// publishes it).
func MessageProto(m *sequencer.Message) *sequencerv1.Message { return messageProto(m) }

func messageProto(m *sequencer.Message) *sequencerv1.Message {
	pm := &sequencerv1.Message{}
	fillMessageProto(pm, m)
	if !m.ServerAt.IsZero() {
		pm.ServerAt = timestamppb.New(m.ServerAt)
	}
	return pm
}

// fillMessageProto sets pm's fields from m, but server_at.
func fillMessageProto(pm *sequencerv1.Message, m *sequencer.Message) {
	pm.MsgId, pm.ConvId, pm.Seq, pm.FromUid = m.MsgID, m.ConvID, m.Seq, m.FromUID
	pm.MsgType, pm.Body, pm.ClientMsgId = int32(m.MsgType), m.Body, m.ClientMsgID
	pm.Kind, pm.TargetMsgId, pm.Recalled, pm.EditCount = sequencerv1.MessageKind(m.Kind), m.TargetMsgID, m.Recalled, m.EditCount
	if !m.EditedAt.IsZero() {
		pm.EditedAt = timestamppb.New(m.EditedAt)
	}
}

// fail records and logs a failed RPC and returns the error for the client
// (see ToConnectError). attrs are slog key/value pairs for the log line.
func (s *Service) fail(ctx context.Context, method string, err error, attrs ...any) error {
	code := CodeOf(ctx, err)
	s.count(method, code.String())
	if method == methodSend {
		s.countFailedSend(code)
	}
	return s.logFailure(ctx, method, err, attrs...)
}

// countFailedSend counts one message (a Send or a batch item) that failed,
// in sequencer_sends_total. A SendBatch refused as a whole is no message.
func (s *Service) countFailedSend(code sequencer.Code) {
	if s.metrics != nil {
		s.metrics.Sends.WithLabelValues(code.String()).Inc()
	}
}

// logFailure logs internal errors (retryable ones at debug) and returns the
// client's error.
func (s *Service) logFailure(ctx context.Context, method string, err error, attrs ...any) *connect.Error {
	code := CodeOf(ctx, err)
	switch {
	case code == sequencer.CodeInternal:
		s.log.ErrorContext(ctx, "rpc failed", append([]any{"method", method, "code", code.String(), "err", err}, attrs...)...)
	case code.Retryable():
		s.log.DebugContext(ctx, "rpc failed, retryable", append([]any{"method", method, "code", code.String(), "err", err}, attrs...)...)
	}
	return ToConnectError(ctx, err)
}

func (s *Service) ok(method string) {
	if s.metrics == nil {
		return
	}
	switch method {
	case methodSend:
		s.hot.sendOK.get(func() prometheus.Counter { return s.metrics.Requests.WithLabelValues(methodSend, "ok") }).Inc()
	case methodSendBatch:
		s.hot.batchOK.get(func() prometheus.Counter { return s.metrics.Requests.WithLabelValues(methodSendBatch, "ok") }).Inc()
	default:
		s.count(method, "ok")
	}
}

// refuse counts an RPC refused by a guard in front of the handler (token,
// size) under its method and code.
func (s *Service) refuse(r *http.Request, code connect.Code) {
	method := procedureMethod(r.URL.Path)
	switch method {
	case methodSend, methodSendBatch, methodPull, methodGetHead, methodGetMessage, methodRoute, methodMarkRead, methodReadState, methodPullMany, methodSubscribe,
		methodReceipts, methodPositions:
	default:
		method = "unknown" // the label set stays bounded whatever the path
	}
	s.count(method, code.String())
}

// observeSend records the latency of a Send or SendBatch started at start,
// by the RPC's code: "ok", "duplicate" (a Send answered with the first
// send's ids), else the error's code (invalid_argument, unavailable, ...).
// A SendBatch that answered is "ok" whatever its items' codes
// (sequencer_sends_total counts those).
func (s *Service) observeSend(ctx context.Context, method string, start time.Time, err error, dup bool) {
	if s.metrics == nil {
		return
	}
	var h prometheus.Observer
	switch {
	case err != nil:
		h = s.metrics.SendSeconds.WithLabelValues(method, CodeOf(ctx, err).String())
	case method == methodSend && dup:
		h = s.hot.sendSecondsDup.get(func() prometheus.Observer { return s.metrics.SendSeconds.WithLabelValues(methodSend, "duplicate") })
	case method == methodSend:
		h = s.hot.sendSecondsOK.get(func() prometheus.Observer { return s.metrics.SendSeconds.WithLabelValues(methodSend, "ok") })
	case method == methodSendBatch:
		h = s.hot.batchSecondsOK.get(func() prometheus.Observer { return s.metrics.SendSeconds.WithLabelValues(methodSendBatch, "ok") })
	default:
		h = s.metrics.SendSeconds.WithLabelValues(method, "ok")
	}
	h.Observe(time.Since(start).Seconds())
}

func (s *Service) count(method, code string) {
	if s.metrics != nil {
		s.metrics.Requests.WithLabelValues(method, code).Inc()
	}
}

// hotMetrics holds the series every successful send updates, looked up
// (label hashing, a map lookup under a lock) on first use only. They are
// resolved lazily so a series still appears in /metrics only once it
// happened.
type hotMetrics struct {
	sendsOK, sendsDup                             cached[prometheus.Counter]
	sendOK, batchOK                               cached[prometheus.Counter]
	sendSecondsOK, sendSecondsDup, batchSecondsOK cached[prometheus.Observer]
}

// cached is a value computed on first use; concurrent first uses may each
// compute it (WithLabelValues returns the same series every time).
type cached[T any] struct{ p atomic.Pointer[T] }

func (c *cached[T]) get(resolve func() T) T {
	if p := c.p.Load(); p != nil {
		return *p
	}
	v := resolve()
	c.p.Store(&v)
	return v
}

// recovered answers a panicking handler with internal and logs the panic.
func (s *Service) recovered(ctx context.Context, spec connect.Spec, _ http.Header, p any) error {
	s.count(procedureMethod(spec.Procedure), sequencer.CodeInternal.String())
	s.log.ErrorContext(ctx, "rpc panicked", "procedure", spec.Procedure, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	return connect.NewError(connect.CodeInternal, errors.New("internal error"))
}

// procedureMethod returns "Send" for "/sequencer.v1.SequencerService/Send".
func procedureMethod(procedure string) string {
	for i := len(procedure) - 1; i >= 0; i-- {
		if procedure[i] == '/' {
			return procedure[i+1:]
		}
	}
	return procedure
}
