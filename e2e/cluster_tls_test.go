package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/persist/pgtest"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	"github.com/sequencer-im/sequencer/proto/cluster/v1/clusterv1connect"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// writeClusterPKI writes a cluster CA and one node certificate (server and
// client auth) signed by it into dir, as --cluster-tls-* expects them.
func writeClusterPKI(t *testing.T, dir string) (certFile, keyFile, caFile string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, nodeKey := newKey(), newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test cluster CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	nodeTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	nodeDER, err := x509.CreateCertificate(rand.Reader, nodeTmpl, caCert, &nodeKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile = filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"), filepath.Join(dir, "ca.crt")
	for f, blk := range map[string]*pem.Block{
		certFile: {Type: "CERTIFICATE", Bytes: nodeDER},
		keyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
		caFile:   {Type: "CERTIFICATE", Bytes: caDER},
	} {
		if err := os.WriteFile(f, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile, caFile
}

// TestClusterMutualTLS runs two node processes with --cluster-tls-cert,
// --cluster-tls-key and --cluster-ca: a send through the node that does not
// own the conversation is forwarded over mutual TLS and stored, and a plain
// (h2c) client on the cluster port gets nowhere.
func TestClusterMutualTLS(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	cert, key, ca := writeClusterPKI(t, t.TempDir())
	tlsArgs := []string{"--cluster-tls-cert", cert, "--cluster-tls-key", key, "--cluster-ca", ca}
	clusterA, clusterB := freeAddr(t), freeAddr(t)
	a := startNode(t, "a", append([]string{"--store", dsn, "--cluster-listen", clusterA, "--node-id", "a"}, tlsArgs...)...)
	startNode(t, "b", append([]string{"--store", dsn, "--cluster-listen", clusterB, "--node-id", "b"}, tlsArgs...)...)
	ca2 := a.grpcClient()
	var conv string
	waitFor(t, 30*time.Second, "a send through a forwarded to b", func() bool {
		for i := 0; i < 200; i++ {
			c := fmt.Sprintf("tls-%d", i)
			r, err := ca2.Route(context.Background(), connect.NewRequest(&sequencerv1.RouteRequest{ConvId: c}))
			if err == nil && r.Msg.NodeId == "b" {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := send(ctx, ca2, c, 1, "tls-"+c, nil)
				cancel()
				if err == nil && resp.Seq == 1 {
					conv = c
					return true
				}
			}
		}
		return false
	})
	t.Logf("%s (owned by b) sent through a over mutual TLS", conv)
	plain := clusterv1connect.NewClusterServiceClient(h2cClient(), "http://"+clusterB)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := plain.Forward(ctx, connect.NewRequest(&clusterv1.ForwardBatch{FromNode: "a",
		Items: []*clusterv1.ForwardItem{{ConvId: conv, FromUid: 1, ClientMsgId: "plain", MsgType: 1}}}))
	if err == nil {
		t.Fatal("a plain h2c client was served on the mutual-TLS cluster port")
	}
}
