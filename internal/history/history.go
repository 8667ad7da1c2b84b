// Package history records what clients were told by a sequencer cluster and
// checks it, per conversation, against the contract's model of a
// conversation: an append-only log of client keys. It owns the model and the
// recording; it never talks to a node or a store (the tests that use it do).
//
// The model (docs/TESTING.md "Checked histories"):
//   - Send(key) answered with seq s appends key once: if key is already in the
//     log at index i the answer must be i (a resend gets the first index),
//     otherwise s must be len+1 and key is appended.
//   - Send answered with an error (a code the server answered that is not
//     deadline_exceeded or canceled: CONTRACT section 6) changes nothing, ever.
//   - Send whose outcome is unknown (transport error, deadline_exceeded,
//     canceled, a client's own timeout) may append key at any moment after it
//     was invoked, or never: it is modelled with no return time.
//   - Pull(after) returning keys k1..kn: the log at after+1..after+n is k1..kn.
//   - GetHead returning h: the log has exactly h entries.
//
// The check is porcupine's linearizability search over those operations.
package history

import (
	"bufio"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// Kind is the operation.
type Kind int

const (
	Send Kind = iota
	Pull
	Head
)

func (k Kind) String() string {
	switch k {
	case Send:
		return "send"
	case Pull:
		return "pull"
	case Head:
		return "head"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Outcome is what the client learned.
type Outcome int

const (
	OK      Outcome = iota // answered with a result
	Failed                 // answered with an error: nothing happened, ever
	Unknown                // no answer, or an answer that does not tell
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// OutcomeOfCode classifies a Send's error code (the connect / domain code
// names: "unavailable", "deadline_exceeded", ...). answered says the code was
// answered by a node (connect.IsWireError); a code the client synthesized for
// a transport error tells nothing. "" is OK.
func OutcomeOfCode(code string, answered bool) Outcome {
	switch {
	case code == "":
		return OK
	case !answered:
		return Unknown
	case code == "deadline_exceeded", code == "canceled", code == "unknown":
		return Unknown
	}
	return Failed
}

// Untracked is the Code of a Send a test adds for a stored row that no
// recorded client sent (a test's own writes): unknown outcome, not counted.
const Untracked = "untracked"

// Op is one operation as a client saw it.
type Op struct {
	Kind     Kind
	Conv     string
	Node     string // the node the client asked ("" when an SDK chose)
	Client   int    // the client (worker) id
	Key      string // Send: "from_uid/client_msg_id"
	AfterSeq uint64 // Pull
	Call     time.Duration
	Return   time.Duration // ignored for Unknown
	Outcome  Outcome
	Code     string // the error code, "" when OK
	Msg      string // the error's message, for the record (never checked)
	// Results, when OK.
	Seq       uint64   // Send
	MsgID     uint64   // Send
	Duplicate bool     // Send
	Head      uint64   // Head
	Keys      []string // Pull: the keys of the messages returned, in order
	Seqs      []uint64 // Pull: their seqs (must be after+1, after+2, ...)
	// Final marks a Pull that read the whole conversation after every other
	// operation of it returned (a test's last look at the store).
	Final bool
}

func (o Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", o.Kind, o.Conv)
	switch o.Kind {
	case Send:
		fmt.Fprintf(&b, " key=%s", o.Key)
	case Pull:
		fmt.Fprintf(&b, " after=%d", o.AfterSeq)
	}
	if o.Node != "" {
		fmt.Fprintf(&b, " via %s", o.Node)
	}
	fmt.Fprintf(&b, " client %d [%v, %v] -> %s", o.Client, o.Call, o.Return, o.Outcome)
	if o.Code != "" {
		fmt.Fprintf(&b, " %s", o.Code)
	}
	if o.Outcome == OK {
		switch o.Kind {
		case Send:
			fmt.Fprintf(&b, " seq=%d msg_id=%d", o.Seq, o.MsgID)
			if o.Duplicate {
				b.WriteString(" duplicate")
			}
		case Pull:
			fmt.Fprintf(&b, " %d messages", len(o.Keys))
		case Head:
			fmt.Fprintf(&b, " head=%d", o.Head)
		}
	}
	if o.Msg != "" {
		fmt.Fprintf(&b, ": %s", o.Msg)
	}
	return b.String()
}

// Recorder collects operations from many goroutines. Times are measured from
// the recorder's creation on the monotonic clock.
//
// A recorder from NewFileRecorder keeps the operations in a file, not in
// memory: an hour's soak records millions of them, and held on the heap of
// the process that also runs the clients (and the proxies its nodes reach
// the store through) they made every garbage collection mark gigabytes of
// pointers, which stalled that process for seconds (docs/TESTING.md "Soak",
// run 8).
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
	// The file mode: the operations gob-encoded in f through w, n of them;
	// err is the first write error, reported by Ops.
	f   *os.File
	w   *bufio.Writer
	enc *gob.Encoder
	n   int
	err error
}

// NewRecorder starts an empty history held in memory.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// NewFileRecorder starts an empty history kept in a new file in dir ("": the
// system's temporary directory). The file is removed at once and read
// through its open descriptor, so nothing is left behind; its space is
// freed by Close, or when the process exits.
func NewFileRecorder(dir string) (*Recorder, error) {
	f, err := os.CreateTemp(dir, "history-*.gob")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	return &Recorder{start: time.Now(), f: f, w: w, enc: gob.NewEncoder(w)}, nil
}

// Now is the time to put in Op.Call and Op.Return.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// Add records one completed (or given up) operation.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		r.ops = append(r.ops, op)
		return
	}
	if r.err != nil {
		return
	}
	if err := r.enc.Encode(&op); err != nil {
		r.err = fmt.Errorf("history: recording operation %d: %w", r.n+1, err)
		return
	}
	r.n++
}

// Ops returns a copy of the history, in the order recorded. A file
// recorder that could not write or read its file panics: the history a
// test would check is not the one its clients saw.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return append([]Op(nil), r.ops...)
	}
	ops, err := r.readBack()
	if err != nil {
		panic(err)
	}
	return ops
}

func (r *Recorder) readBack() ([]Op, error) {
	if r.err != nil {
		return nil, r.err
	}
	if err := r.w.Flush(); err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	size, err := r.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	dec := gob.NewDecoder(bufio.NewReaderSize(io.NewSectionReader(r.f, 0, size), 1<<20))
	ops := make([]Op, r.n)
	for i := range ops {
		if err := dec.Decode(&ops[i]); err != nil {
			return nil, fmt.Errorf("history: reading operation %d of %d: %w", i+1, r.n, err)
		}
	}
	return ops, nil
}

// Close frees a file recorder's file; the recorder records nothing more.
// An in-memory recorder has nothing to free.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	if r.err == nil {
		r.err = errors.New("history: recorder closed")
	}
	return r.f.Close()
}

// Counts summarises a history for a report.
type Counts struct {
	Ops, Sends, Acked, Unknown, Duplicates int
	Errors                                 map[string]int // every failed attempt by code, final or unknown outcome
	SlowestAck                             time.Duration
}

func (c Counts) String() string {
	codes := make([]string, 0, len(c.Errors))
	for k := range c.Errors {
		codes = append(codes, k)
	}
	sort.Strings(codes)
	var f []string
	for _, k := range codes {
		f = append(f, fmt.Sprintf("%s=%d", k, c.Errors[k]))
	}
	return fmt.Sprintf("%d operations (%d send attempts: %d acked, %d duplicate answers, %d unknown outcome, errors {%s}); slowest acked attempt %v",
		c.Ops, c.Sends, c.Acked, c.Duplicates, c.Unknown, strings.Join(f, " "), c.SlowestAck.Round(time.Millisecond))
}

// Count summarises ops.
func Count(ops []Op) Counts {
	c := Counts{Ops: len(ops), Errors: map[string]int{}}
	for _, o := range ops {
		if o.Kind != Send || o.Code == Untracked {
			continue
		}
		c.Sends++
		switch o.Outcome {
		case OK:
			c.Acked++
			if o.Duplicate {
				c.Duplicates++
			}
			if d := o.Return - o.Call; d > c.SlowestAck {
				c.SlowestAck = d
			}
		case Unknown:
			c.Unknown++
			if o.Code != "" {
				c.Errors[o.Code]++
			}
		case Failed:
			c.Errors[o.Code]++
		}
	}
	return c
}
