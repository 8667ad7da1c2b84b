// Package natssink is the firehose's NATS JetStream sink (firehose.Sink):
// each message goes to the subject PREFIX.<partition> with the headers
// Nats-Msg-Id (the msg_id, for JetStream's de-duplication),
// Sequencer-Conv-Id, Sequencer-Seq and Sequencer-Msg-Id, and the Message
// (protobuf, or protojson) as payload. It checks at Open that a stream
// covers the subjects, or creates one (docs/FEED.md). It never logs a
// credential.
package natssink

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/api"
)

// Headers of every published message (besides jetstream.MsgIDHeader).
const (
	HeaderConvID = "Sequencer-Conv-Id"
	HeaderSeq    = "Sequencer-Seq"
	HeaderMsgID  = "Sequencer-Msg-Id"
)

// Config configures a Sink.
type Config struct {
	URL            string        // nats://HOST:PORT[,nats://...] (tls:// for TLS)
	Subject        string        // the subjects' prefix (default "sequencer")
	Format         string        // "proto" (default) or "json"
	CreateStream   bool          // create the stream when no stream covers the subjects
	Duplicates     time.Duration // the created stream's duplicate window (default 2 h)
	Replicas       int           // the created stream's replicas (default 1)
	CredsFile      string        // NATS credentials file (nats.UserCredentials)
	CAFile         string        // CA of the server's TLS certificate (nats.RootCAs)
	CertFile       string        // client certificate (with KeyFile: nats.ClientCert)
	KeyFile        string
	PublishTimeout time.Duration // a publish not acknowledged by then fails (default 5 s)
	MaxPending     int           // publishes in flight (default 4096)
	Name           string        // the connection's name (the node id)
}

// Defaults of a created stream.
const (
	DefaultDuplicates = 2 * time.Hour
	DefaultSubject    = "sequencer"
)

// Sink publishes to JetStream. Safe for concurrent use.
type Sink struct {
	pending sync.Map // *nats.Msg -> func(error): publishes awaiting their ack
	nc      *nats.Conn
	js      jetstream.JetStream
	prefix  string
	json    bool
	stream  string
	created bool
}

// CheckURL validates a --feed-nats value: one or more comma-separated
// nats://, tls://, ws:// or wss:// URLs with a host.
func CheckURL(raw string) error {
	for _, u := range strings.Split(raw, ",") {
		p, err := url.Parse(strings.TrimSpace(u))
		if err != nil || p.Host == "" {
			return fmt.Errorf("--feed-nats: %q is not a NATS URL (want nats://HOST:PORT)", redact(u))
		}
		switch p.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("--feed-nats: scheme %q is not NATS's (want nats://HOST:PORT or tls://HOST:PORT)", p.Scheme)
		}
	}
	return nil
}

// redact drops a URL's user information.
func redact(raw string) string {
	p, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "(unparsable)"
	}
	p.User = nil
	return p.String()
}

// StreamName is the name of the stream --feed-create-stream creates for a
// subject prefix: the prefix in upper case, '.' and other characters
// streams refuse as '_'.
func StreamName(prefix string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, prefix)
}

// Open connects, and checks (or creates) the stream. A broker that does not
// answer within ctx is an error: the node refuses to start.
func Open(ctx context.Context, cfg Config) (*Sink, error) {
	if err := CheckURL(cfg.URL); err != nil {
		return nil, err
	}
	if cfg.Subject == "" {
		cfg.Subject = DefaultSubject
	}
	if strings.ContainsAny(cfg.Subject, " *>") || strings.HasPrefix(cfg.Subject, ".") || strings.HasSuffix(cfg.Subject, ".") {
		return nil, fmt.Errorf("--feed-subject %q: not a subject prefix (tokens separated by '.', no wildcards)", cfg.Subject)
	}
	switch cfg.Format {
	case "", "proto", "json":
	default:
		return nil, fmt.Errorf("--feed-format %q: want proto or json", cfg.Format)
	}
	if cfg.Duplicates <= 0 {
		cfg.Duplicates = DefaultDuplicates
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 5 * time.Second
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 4096
	}
	opts := []nats.Option{nats.Name("sequencer " + cfg.Name), nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond), nats.ReconnectBufSize(-1)}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	if d, ok := ctx.Deadline(); ok {
		opts = append(opts, nats.Timeout(time.Until(d)))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("--feed-nats %s: cannot connect: %w (is nats-server running with -js?)", redact(cfg.URL), err)
	}
	s := &Sink{nc: nc, prefix: cfg.Subject, json: cfg.Format == "json"}
	// Acks come back through callbacks on nats.go's ack goroutine (a
	// goroutine per publish waiting on its future cost about a fifth of the
	// node's CPU per message: stacks grown and freed). The client calls the
	// error callback for a nack, a timeout and a reconnect, so every publish
	// is answered.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) { s.answer(m, nil) }),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { s.answer(m, err) }))
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.js = js
	if err := s.ensureStream(ctx, cfg); err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

// ensureStream finds the stream holding PREFIX.*, checks it covers every
// partition's subject, or creates it.
func (s *Sink) ensureStream(ctx context.Context, cfg Config) error {
	all := s.prefix + ".*"
	name, err := s.js.StreamNameBySubject(ctx, all)
	switch {
	case err == nil:
		st, err := s.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("feed stream %q: %w", name, err)
		}
		info := st.CachedInfo()
		if !covers(info.Config.Subjects, s.prefix) {
			return fmt.Errorf("feed stream %q has subjects %v, which do not cover %s.<partition>: add %q to its subjects", name, info.Config.Subjects, s.prefix, all)
		}
		s.stream = name
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("--feed-nats %s: JetStream is not enabled on the server (start nats-server with -js)", redact(cfg.URL))
	default:
		return fmt.Errorf("--feed-nats %s: looking up the stream of %s: %w", redact(cfg.URL), all, err)
	}
	if !cfg.CreateStream {
		return fmt.Errorf("no JetStream stream holds the subjects %s: create one (nats stream add %s --subjects '%s' --storage file --dupe-window %s) or start with --feed-create-stream",
			all, StreamName(s.prefix), all, DefaultDuplicates)
	}
	s.stream = StreamName(s.prefix)
	_, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: s.stream, Subjects: []string{all}, Storage: jetstream.FileStorage,
		Duplicates: cfg.Duplicates, Replicas: cfg.Replicas, Retention: jetstream.LimitsPolicy,
	})
	if err != nil {
		return fmt.Errorf("creating the feed stream %q: %w", s.stream, err)
	}
	s.created = true
	return nil
}

// covers reports whether a stream's subjects hold every PREFIX.<n>.
func covers(subjects []string, prefix string) bool {
	for _, sub := range subjects {
		if sub == ">" || sub == prefix+".*" || sub == prefix+".>" {
			return true
		}
		if strings.HasSuffix(sub, ".>") && strings.HasPrefix(prefix+".", strings.TrimSuffix(sub, ">")) {
			return true
		}
	}
	return false
}

// Stream is the stream's name; Created says Open created it.
func (s *Sink) Stream() (string, bool) { return s.stream, s.created }

// Subject is partition part's subject.
func (s *Sink) Subject(part uint32) string {
	return s.prefix + "." + strconv.FormatUint(uint64(part), 10)
}

// Encode is the payload of m.
func (s *Sink) Encode(m *sequencer.Message) ([]byte, error) {
	pm := api.MessageProto(m)
	if s.json {
		return protojson.Marshal(pm)
	}
	return proto.Marshal(pm)
}

// Publish implements firehose.Sink.
func (s *Sink) Publish(part uint32, m sequencer.Message, done func(error)) {
	data, err := s.Encode(&m)
	if err != nil {
		done(err)
		return
	}
	id := strconv.FormatUint(m.MsgID, 10)
	msg := nats.NewMsg(s.Subject(part))
	msg.Header.Set(jetstream.MsgIDHeader, id)
	msg.Header.Set(HeaderConvID, m.ConvID)
	msg.Header.Set(HeaderSeq, strconv.FormatUint(m.Seq, 10))
	msg.Header.Set(HeaderMsgID, id)
	msg.Data = data
	s.pending.Store(msg, done)
	if _, err := s.js.PublishMsgAsync(msg, jetstream.WithExpectStream(s.stream)); err != nil {
		s.answer(msg, err)
	}
}

// answer calls the done of msg's publish, once.
func (s *Sink) answer(msg *nats.Msg, err error) {
	if done, ok := s.pending.LoadAndDelete(msg); ok {
		done.(func(error))(err)
	}
}

// Connected reports whether the connection to NATS is up.
func (s *Sink) Connected() bool { return s.nc.IsConnected() }

// Close drains nothing: what is not acknowledged is published again by the
// next owner from the store's cursor.
func (s *Sink) Close() { s.nc.Close() }
