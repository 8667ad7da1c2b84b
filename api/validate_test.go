package api

import (
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

func validSend() *sequencerv1.SendRequest {
	return &sequencerv1.SendRequest{ConvId: "g:42", FromUid: 1001, ClientMsgId: "5f0c-1", Body: []byte("hi")}
}

func TestValidateSend(t *testing.T) {
	s64 := strings.Repeat("a", 64)
	tests := []struct {
		name    string
		edit    func(r *sequencerv1.SendRequest)
		maxBody int
		wantErr string // substring; "" means valid
		check   func(t *testing.T, got sequencer.SendRequest)
	}{
		{name: "valid", check: func(t *testing.T, got sequencer.SendRequest) {
			want := sequencer.SendRequest{ConvID: "g:42", FromUID: 1001, ClientMsgID: "5f0c-1", MsgType: 1, Body: []byte("hi")}
			if got.ConvID != want.ConvID || got.FromUID != want.FromUID || got.ClientMsgID != want.ClientMsgID ||
				got.MsgType != want.MsgType || string(got.Body) != string(want.Body) {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		}},
		// conv_id
		{name: "conv_id empty", edit: func(r *sequencerv1.SendRequest) { r.ConvId = "" }, wantErr: "conv_id: must be 1..64 bytes, got 0"},
		{name: "conv_id 64 bytes ok", edit: func(r *sequencerv1.SendRequest) { r.ConvId = s64 }},
		{name: "conv_id 65 bytes", edit: func(r *sequencerv1.SendRequest) { r.ConvId = s64 + "a" }, wantErr: "conv_id: must be 1..64 bytes, got 65"},
		// 22 x "é" (2 bytes) = 44 bytes, 33 x = 66 bytes: the limit counts bytes, not runes.
		{name: "conv_id 32 runes 64 bytes ok", edit: func(r *sequencerv1.SendRequest) { r.ConvId = strings.Repeat("é", 32) }},
		{name: "conv_id 33 runes 66 bytes", edit: func(r *sequencerv1.SendRequest) { r.ConvId = strings.Repeat("é", 33) }, wantErr: "conv_id: must be 1..64 bytes, got 66"},
		{name: "conv_id invalid utf8", edit: func(r *sequencerv1.SendRequest) { r.ConvId = "g:\xff" }, wantErr: "conv_id: must be valid UTF-8"},
		{name: "conv_id NUL", edit: func(r *sequencerv1.SendRequest) { r.ConvId = "g:\x00" }, wantErr: "conv_id: must not contain control characters, found U+0000 at byte 2"},
		{name: "conv_id newline", edit: func(r *sequencerv1.SendRequest) { r.ConvId = "g\n1" }, wantErr: "conv_id: must not contain control characters, found U+000A at byte 1"},
		{name: "conv_id DEL", edit: func(r *sequencerv1.SendRequest) { r.ConvId = "g\x7f" }, wantErr: "found U+007F"},
		{name: "conv_id C1", edit: func(r *sequencerv1.SendRequest) { r.ConvId = "g\u0085" }, wantErr: "found U+0085"},
		{name: "conv_id unicode ok", edit: func(r *sequencerv1.SendRequest) { r.ConvId = "群:42:😀" }},
		// from_uid
		{name: "from_uid 0", edit: func(r *sequencerv1.SendRequest) { r.FromUid = 0 }, wantErr: "from_uid: must be > 0 and < 2^63, got 0"},
		{name: "from_uid 1 ok", edit: func(r *sequencerv1.SendRequest) { r.FromUid = 1 }},
		{name: "from_uid 2^63-1 ok", edit: func(r *sequencerv1.SendRequest) { r.FromUid = 1<<63 - 1 }},
		{name: "from_uid 2^63", edit: func(r *sequencerv1.SendRequest) { r.FromUid = 1 << 63 }, wantErr: "from_uid: must be > 0 and < 2^63, got 9223372036854775808"},
		{name: "from_uid max uint64", edit: func(r *sequencerv1.SendRequest) { r.FromUid = ^uint64(0) }, wantErr: "from_uid:"},
		// client_msg_id
		{name: "client_msg_id empty", edit: func(r *sequencerv1.SendRequest) { r.ClientMsgId = "" }, wantErr: "client_msg_id: must be 1..64 bytes, got 0"},
		{name: "client_msg_id 64 ok", edit: func(r *sequencerv1.SendRequest) { r.ClientMsgId = s64 }},
		{name: "client_msg_id 65", edit: func(r *sequencerv1.SendRequest) { r.ClientMsgId = s64 + "b" }, wantErr: "client_msg_id: must be 1..64 bytes, got 65"},
		{name: "client_msg_id invalid utf8", edit: func(r *sequencerv1.SendRequest) { r.ClientMsgId = "\xc3" }, wantErr: "client_msg_id: must be valid UTF-8"},
		{name: "client_msg_id tab", edit: func(r *sequencerv1.SendRequest) { r.ClientMsgId = "a\tb" }, wantErr: "client_msg_id: must not contain control characters, found U+0009 at byte 1"},
		{name: "client_msg_id DEL", edit: func(r *sequencerv1.SendRequest) { r.ClientMsgId = "\x7f" }, wantErr: "client_msg_id: must not contain control characters"},
		{name: "client_msg_id C1", edit: func(r *sequencerv1.SendRequest) { r.ClientMsgId = "x\u009f" }, wantErr: "found U+009F"},
		// msg_type
		{name: "msg_type 0 defaults to 1", edit: func(r *sequencerv1.SendRequest) { r.MsgType = 0 }, check: func(t *testing.T, got sequencer.SendRequest) {
			if got.MsgType != 1 {
				t.Fatalf("msg_type = %d, want 1", got.MsgType)
			}
		}},
		{name: "msg_type 32767 ok", edit: func(r *sequencerv1.SendRequest) { r.MsgType = 32767 }, check: func(t *testing.T, got sequencer.SendRequest) {
			if got.MsgType != 32767 {
				t.Fatalf("msg_type = %d, want 32767", got.MsgType)
			}
		}},
		{name: "msg_type 32768", edit: func(r *sequencerv1.SendRequest) { r.MsgType = 32768 }, wantErr: "msg_type: must be 0 (default 1) or 1..32767, got 32768"},
		{name: "msg_type -1", edit: func(r *sequencerv1.SendRequest) { r.MsgType = -1 }, wantErr: "msg_type: must be 0 (default 1) or 1..32767, got -1"},
		// body
		{name: "body empty ok", edit: func(r *sequencerv1.SendRequest) { r.Body = nil }},
		{name: "body at default max ok", edit: func(r *sequencerv1.SendRequest) { r.Body = make([]byte, sequencer.DefaultMaxBody) }},
		{name: "body over default max", edit: func(r *sequencerv1.SendRequest) { r.Body = make([]byte, sequencer.DefaultMaxBody+1) }, wantErr: "body: must be at most 65536 bytes, got 65537"},
		{name: "body at custom max ok", maxBody: 10, edit: func(r *sequencerv1.SendRequest) { r.Body = make([]byte, 10) }},
		{name: "body over custom max", maxBody: 10, edit: func(r *sequencerv1.SendRequest) { r.Body = make([]byte, 11) }, wantErr: "body: must be at most 10 bytes, got 11"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := validSend()
			if tt.edit != nil {
				tt.edit(req)
			}
			got, err := ValidateSend(req, tt.maxBody)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if tt.check != nil {
					tt.check(t, got)
				}
				return
			}
			if err == nil {
				t.Fatalf("want error %q, got nil", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q does not contain %q", err, tt.wantErr)
			}
			if c := sequencer.ErrorCode(err); c != sequencer.CodeInvalidArgument {
				t.Fatalf("code = %v, want invalid_argument", c)
			}
		})
	}
}

func TestValidateSendNil(t *testing.T) {
	_, err := ValidateSend(nil, 0)
	if err == nil || sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument || !strings.HasPrefix(err.Error(), "conv_id:") {
		t.Fatalf("ValidateSend(nil) = %v, want conv_id invalid_argument", err)
	}
}

func TestValidatePull(t *testing.T) {
	tests := []struct {
		name    string
		req     *sequencerv1.PullRequest
		want    PullQuery
		wantErr string
	}{
		{name: "limit 0 means 100", req: &sequencerv1.PullRequest{ConvId: "c", AfterSeq: 5}, want: PullQuery{"c", 5, 100, 1 << 20, 0}},
		{name: "limit 1", req: &sequencerv1.PullRequest{ConvId: "c", Limit: 1}, want: PullQuery{"c", 0, 1, 1 << 20, 0}},
		{name: "limit 1000", req: &sequencerv1.PullRequest{ConvId: "c", Limit: 1000}, want: PullQuery{"c", 0, 1000, 1 << 20, 0}},
		{name: "limit 1001 clamped", req: &sequencerv1.PullRequest{ConvId: "c", Limit: 1001}, want: PullQuery{"c", 0, 1000, 1 << 20, 0}},
		{name: "limit max uint32 clamped", req: &sequencerv1.PullRequest{ConvId: "c", Limit: ^uint32(0)}, want: PullQuery{"c", 0, 1000, 1 << 20, 0}},
		{name: "after_seq max", req: &sequencerv1.PullRequest{ConvId: "c", AfterSeq: ^uint64(0)}, want: PullQuery{"c", ^uint64(0), 100, 1 << 20, 0}},
		{name: "max_bytes 0 means 1 MiB", req: &sequencerv1.PullRequest{ConvId: "c", MaxBytes: 0}, want: PullQuery{"c", 0, 100, 1 << 20, 0}},
		{name: "max_bytes 1", req: &sequencerv1.PullRequest{ConvId: "c", MaxBytes: 1}, want: PullQuery{"c", 0, 100, 1, 0}},
		{name: "max_bytes clamped to 4 MiB", req: &sequencerv1.PullRequest{ConvId: "c", MaxBytes: 5 << 20}, want: PullQuery{"c", 0, 100, 4 << 20, 0}},
		{name: "before_seq kept", req: &sequencerv1.PullRequest{ConvId: "c", BeforeSeq: 7}, want: PullQuery{"c", 0, 100, 1 << 20, 7}},
		{name: "conv_id empty", req: &sequencerv1.PullRequest{}, wantErr: "conv_id: must be 1..64 bytes, got 0"},
		{name: "conv_id 65", req: &sequencerv1.PullRequest{ConvId: strings.Repeat("x", 65)}, wantErr: "conv_id: must be 1..64 bytes, got 65"},
		{name: "conv_id control", req: &sequencerv1.PullRequest{ConvId: "a\rb"}, wantErr: "conv_id: must not contain control characters"},
		{name: "conv_id invalid utf8", req: &sequencerv1.PullRequest{ConvId: "\xfe"}, wantErr: "conv_id: must be valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ValidatePull(tt.req)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
					t.Fatalf("err = %v, want invalid_argument containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestValidateMsgID(t *testing.T) {
	tests := []struct {
		id      uint64
		wantErr bool
	}{
		{0, true}, {1, false}, {1<<63 - 1, false}, {1 << 63, true}, {^uint64(0), true},
	}
	for _, tt := range tests {
		err := ValidateMsgID(tt.id)
		if (err != nil) != tt.wantErr {
			t.Fatalf("ValidateMsgID(%d) = %v, wantErr %v", tt.id, err, tt.wantErr)
		}
		if err != nil && (sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument || !strings.HasPrefix(err.Error(), "msg_id: must be > 0 and < 2^63")) {
			t.Fatalf("ValidateMsgID(%d) = %v", tt.id, err)
		}
	}
}
