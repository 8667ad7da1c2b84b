package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The nemesis's network: a TCP proxy on loopback in front of each thing a
// node dials (its PostgreSQL, each peer's cluster listener). A proxy keys its
// links by the dialer's source IP (each node dials from its own loopback IP,
// see nemesisDialFrom), so "n1 -> n2" and "n3 -> n2" are separate links of
// n2's proxy, and each direction of a link fails on its own.

// linkMode is what one direction of a link does with bytes.
type linkMode int32

const (
	pass      linkMode = iota // forward
	blackhole                 // keep the connection open, forward nothing (bytes are read and lost)
	reset                     // RST every connection; new ones are reset at once
	closing                   // close every connection with a FIN; new ones are closed at once
)

func (m linkMode) String() string {
	return [...]string{"pass", "blackhole", "reset", "close"}[m]
}

// link is the state of one source's connections through a proxy.
type link struct {
	up, down atomic.Int32 // linkMode of dialer->target and target->dialer
	delay    atomic.Int64 // ns added to every chunk, both ways
	mu       sync.Mutex
	conns    map[*pipe]struct{}
}

func (l *link) set(up, down linkMode) {
	l.up.Store(int32(up))
	l.down.Store(int32(down))
	if up == reset || up == closing || down == reset || down == closing {
		l.mu.Lock()
		for p := range l.conns {
			p.kill(up == reset || down == reset)
		}
		l.mu.Unlock()
	}
}

func (l *link) mode() (linkMode, linkMode) { return linkMode(l.up.Load()), linkMode(l.down.Load()) }

// proxy forwards 127.0.0.1:port to target (host:port, or unix:PATH for a
// unix socket).
type proxy struct {
	name   string
	target string
	ln     net.Listener
	mu     sync.Mutex
	links  map[string]*link // by source IP, or all under "" unless bySource
	// bySource keys links by the dialer's IP (peer proxies); a store proxy
	// has one dialer and one link.
	bySource bool
	// keyOf, when set (with bySource), keys a connection by what its
	// first bytes say instead of its source IP: it returns the key and the
	// bytes it read, which are forwarded first (a PostgreSQL startup
	// message's application_name, citusWorkerProxy).
	keyOf  func(c net.Conn) (key string, head []byte)
	closed atomic.Bool
	wg     sync.WaitGroup
}

func newProxy(name, target string, bySource bool) (*proxy, error) {
	return startProxy(&proxy{name: name, target: target, bySource: bySource})
}

// newKeyedProxy is a proxy whose links are keyed by keyOf.
func newKeyedProxy(name, target string, keyOf func(c net.Conn) (string, []byte)) (*proxy, error) {
	return startProxy(&proxy{name: name, target: target, bySource: true, keyOf: keyOf})
}

func startProxy(p *proxy) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.ln, p.links = ln, map[string]*link{}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address to dial instead of the target.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// from returns the link of connections from source IP ip.
func (p *proxy) from(ip string) *link {
	if !p.bySource {
		ip = ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.links[ip]
	if l == nil {
		l = &link{conns: map[*pipe]struct{}{}}
		p.links[ip] = l
	}
	return l
}

// all applies f to the link of every source, present and future.
func (p *proxy) all(f func(l *link)) {
	if !p.bySource {
		f(p.from(""))
		return
	}
	for _, ip := range nemesisSources {
		f(p.from(ip))
	}
}

func (p *proxy) Close() {
	p.closed.Store(true)
	p.ln.Close()
	p.mu.Lock()
	for _, l := range p.links {
		l.mu.Lock()
		for c := range l.conns {
			c.kill(false)
		}
		l.mu.Unlock()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.keyOf == nil {
			p.admit(p.from(c.RemoteAddr().(*net.TCPAddr).IP.String()), c.(*net.TCPConn), nil)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			key, head := p.keyOf(c)
			p.admit(p.from(key), c.(*net.TCPConn), head)
		}()
	}
}

// admit serves c on link l as l's mode says; head is what was read of c
// already.
func (p *proxy) admit(l *link, c *net.TCPConn, head []byte) {
	up, down := l.mode()
	if up == reset || down == reset {
		c.SetLinger(0)
		c.Close()
		return
	}
	if up == closing || down == closing {
		c.Close()
		return
	}
	p.wg.Add(1)
	go p.serve(l, c, head)
}

// halfCloser is a TCP or unix connection.
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// setLinger0 makes closing a TCP connection send a RST.
func setLinger0(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
}

// pipe is one proxied connection.
type pipe struct {
	client *net.TCPConn
	server halfCloser
	once   sync.Once
}

func (c *pipe) kill(rst bool) {
	c.once.Do(func() {
		if rst {
			c.client.SetLinger(0)
			setLinger0(c.server)
		}
		c.client.Close()
		c.server.Close()
	})
}

func (p *proxy) serve(l *link, client *net.TCPConn, head []byte) {
	defer p.wg.Done()
	network, addr := "tcp", p.target
	if path, ok := strings.CutPrefix(p.target, "unix:"); ok {
		network, addr = "unix", path
	}
	sc, err := net.DialTimeout(network, addr, 5*time.Second)
	if err == nil && len(head) > 0 {
		_, err = sc.Write(head)
	}
	if err != nil {
		if sc != nil {
			sc.Close()
		}
		client.SetLinger(0)
		client.Close()
		return
	}
	c := &pipe{client: client, server: sc.(halfCloser)}
	l.mu.Lock()
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
	}()
	done := make(chan struct{}, 2)
	go func() { copyLink(c.server, c.client, &l.up, &l.delay); done <- struct{}{} }()
	go func() { copyLink(c.client, c.server, &l.down, &l.delay); done <- struct{}{} }()
	<-done
	c.kill(false)
	<-done
}

// copyLink copies src to dst, applying the direction's mode and delay to
// each chunk as it is read. A delayed chunk keeps its order: chunks wait in
// a queue and are written when their time comes.
func copyLink(dst, src halfCloser, mode *atomic.Int32, delay *atomic.Int64) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for ch := range q {
			if d := time.Until(ch.at); d > 0 {
				time.Sleep(d)
			}
			if linkMode(mode.Load()) == blackhole {
				continue // lost on the way
			}
			if _, err := dst.Write(ch.b); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && linkMode(mode.Load()) != blackhole {
			b := append([]byte(nil), buf[:n]...)
			select {
			case q <- chunk{b, time.Now().Add(time.Duration(delay.Load()))}:
			case <-writerDone:
				close(q)
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				setLinger0(src)
			}
			close(q)
			<-writerDone
			dst.CloseWrite()
			return
		}
	}
}

// nemesisSources are the loopback IPs nodes dial from: node i (1-based)
// dials from nemesisSources[i-1].
var nemesisSources = []string{"127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"}

func nodeSource(i int) string {
	if i < 1 || i > len(nemesisSources) {
		panic(fmt.Sprintf("no source IP for node %d", i))
	}
	return nemesisSources[i-1]
}
