// Command intruder is the multi-host tests' attacker: it dials a gorun
// endpoint (a rank's mesh port or the rendezvous) over QUIC with gorun's
// ALPN and a certificate of its own making, as a process without the job
// secret would, and tries to send a message. It prints "handshake refused:
// ..." and exits 0 when the endpoint turns it away, and exits 1 if the
// handshake succeeds (then the data was offered to the job).
//
//	intruder -addr 198.18.77.11:40000
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"math/big"
	"os"
	"time"

	"github.com/gorun/gorun/rank"
	"github.com/quic-go/quic-go"
)

func main() {
	addr := flag.String("addr", "", "host:port of the endpoint to attack")
	timeout := flag.Duration("timeout", 5*time.Second, "handshake timeout")
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "intruder: -addr is required")
		os.Exit(2)
	}
	cert, err := selfSigned()
	if err != nil {
		fmt.Fprintln(os.Stderr, "intruder:", err)
		os.Exit(2)
	}
	tlsConf := &tls.Config{
		// Offer the certificate whatever the server asks for (Go would
		// otherwise send none when it is not from the job CA).
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		InsecureSkipVerify:   true, // the intruder accepts any server: only the server's check matters here
		NextProtos:           []string{rank.ALPN},
		ServerName:           "gorun",
		MinVersion:           tls.VersionTLS13,
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := quic.DialAddr(ctx, *addr, tlsConf, &quic.Config{HandshakeIdleTimeout: *timeout, MaxIdleTimeout: *timeout})
	if err != nil {
		fmt.Printf("handshake refused: %v\n", err)
		return
	}
	// TLS 1.3: the client may finish its side before the server has
	// checked the client's certificate; a refusal then closes the
	// connection right after. Try to use it.
	str, err := conn.OpenStreamSync(ctx)
	if err == nil {
		_, err = str.Write([]byte("garbage from an intruder\x00\x00\x00\x00\x00\x00\x00\x00"))
		if err == nil {
			err = str.Close()
		}
	}
	if err == nil {
		buf := make([]byte, 1)
		_, err = str.Read(buf)
	}
	if err != nil {
		fmt.Printf("handshake refused: %v\n", err)
		return
	}
	fmt.Printf("intruder: %s accepted a connection without the job secret\n", *addr)
	os.Exit(1)
}

func selfSigned() (tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "rank 1"},
		DNSNames:              []string{"gorun"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}, nil
}
