package e2e

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	"connectrpc.com/connect"
)

// numbers are elided from error messages so that equal errors group.
var numbers = regexp.MustCompile(`[0-9][0-9.]*(ms|s|µs)?`)

// answerClass is what a client was answered, for counting: "ack", or the
// code and the message with numbers elided.
func answerClass(err error) string {
	if err == nil {
		return "ack"
	}
	text := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		text = ce.Message() // without the code Error() puts in front
	}
	msg := connect.CodeOf(err).String() + ": " + numbers.ReplaceAllString(text, "N")
	if len(msg) > 160 {
		msg = msg[:160] + "..."
	}
	return msg
}

// answers counts, by class, the errors the load's clients got while
// recording (a load's onError is note).
type answers struct {
	mu sync.Mutex
	on bool
	n  map[string]int
}

func newAnswers(on bool) *answers { return &answers{on: on, n: map[string]int{}} }

func (a *answers) note(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.on {
		a.n[answerClass(err)]++
	}
}

// record starts or stops counting.
func (a *answers) record(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.on = on
}

// count is how many answers of class k were counted.
func (a *answers) count(k string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[k]
}

// not returns the classes counted that do not start with prefix.
func (a *answers) not(prefix string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for k := range a.n {
		if !strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

// lines lists the counts, "Nx class", sorted.
func (a *answers) lines() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for k, v := range a.n {
		out = append(out, fmt.Sprintf("%dx %s", v, k))
	}
	sort.Strings(out)
	return out
}

// take is lines, then counting starts over.
func (a *answers) take() []string {
	out := a.lines()
	a.mu.Lock()
	clear(a.n)
	a.mu.Unlock()
	return out
}

func (a *answers) String() string { return strings.Join(a.lines(), "\n  ") }
