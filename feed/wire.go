package feed

import "sync"

// Wire is the encoded form of one live message, shared by every stream
// that sends it: the first stream to send it in an encoding (the API's
// codec, by name) encodes it, the others reuse those bytes. So a message
// published to N subscribers is encoded once per encoding in use, not N
// times. The feed only carries it (Event.Wire); what the bytes are is the
// API's business.
type Wire struct {
	mu  sync.Mutex
	enc []wireEnc
}

type wireEnc struct {
	name string
	b    []byte
}

// Encoded returns the bytes of the encoding name, calling encode the first
// time only (the other streams wait for it rather than encode it again).
// The bytes are shared: they must not be changed.
func (w *Wire) Encoded(name string, encode func() ([]byte, error)) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.enc {
		if e.name == name {
			return e.b, nil
		}
	}
	b, err := encode()
	if err != nil {
		return nil, err
	}
	w.enc = append(w.enc, wireEnc{name, b})
	return b, nil
}
