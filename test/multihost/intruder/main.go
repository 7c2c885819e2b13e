// Command intruder is the multi-host tests' attacker: it dials a gorun
// endpoint (a rank's mesh port or the rendezvous) over QUIC with gorun's
// ALPN and a certificate of its own making, as a process without the job
// secret would, and tries to send a message. It prints what happened, with
// the reason, and its exit status says which it was:
//
//	0  "handshake refused: ..." the endpoint turned it away with a TLS
//	   alert (quoted: the endpoint's own refusal)
//	1  "intruder: ..." the endpoint completed the handshake: it answered
//	   the data, or closed the connection only afterwards
//	2  bad usage
//	3  "no refusal: ..." nothing answered in time, the port was closed, or
//	   another error that is not the endpoint's refusal (an idle timeout
//	   proves nothing about authentication)
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
	"errors"
	"flag"
	"fmt"
	"math/big"
	"os"
	"strings"
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
		report(*addr, "during the handshake", err)
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
		report(*addr, "after our side of the handshake (TLS 1.3: the server checks a client's certificate last)", err)
	}
	fmt.Printf("intruder: %s accepted a connection without the job secret\n", *addr)
	os.Exit(1)
}

// report prints why the attempt ended and exits: 0 when the endpoint
// refused us, 3 when the error says nothing about its authentication.
func report(addr, during string, err error) {
	var te *quic.TransportError
	var ae *quic.ApplicationError
	var it *quic.IdleTimeoutError
	var ht *quic.HandshakeTimeoutError
	switch {
	case errors.As(err, &te) && te.Remote && te.ErrorCode.IsCryptoError():
		fmt.Printf("handshake refused: %s rejected our certificate with the TLS alert %q %s (%v)\n",
			addr, strings.TrimPrefix(te.ErrorCode.Message(), "tls: "), during, err)
		os.Exit(0)
	case errors.As(err, &ae) && ae.Remote:
		// A QUIC endpoint can close with an application error only once
		// its side of the handshake is complete: it took our certificate.
		fmt.Printf("intruder: %s completed the handshake with a certificate of our own making, then closed the connection %s (code %d: %q)\n",
			addr, during, ae.ErrorCode, ae.ErrorMessage)
		os.Exit(1)
	case errors.As(err, &it), errors.As(err, &ht), errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		fmt.Printf("no refusal: %s did not answer %s (timed out: %v); that proves nothing about its authentication\n", addr, during, err)
	default:
		fmt.Printf("no refusal: %s: an error %s, but not the endpoint's refusal: %v\n", addr, during, err)
	}
	os.Exit(3)
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
