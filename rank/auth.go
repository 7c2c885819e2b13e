package rank

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// ALPN is the application protocol (and its version) every gorun endpoint
// speaks. A peer that speaks another version fails the handshake with a
// clear error.
const ALPN = "gorun/1"

const serverName = "gorun"

// jobAuth holds the TLS material of one endpoint: the job CA, derived from
// the job secret so that every holder of the secret derives the same one,
// and a leaf certificate this process issued itself.
type jobAuth struct {
	pool  *x509.CertPool
	leaf  tls.Certificate
	label string
}

// deriveCA derives the job CA's key and certificate from the secret. The CA
// certificate is deterministic (Ed25519 signatures are), so all ranks agree
// on it without exchanging anything.
func deriveCA(secret []byte) (ed25519.PrivateKey, *x509.Certificate, error) {
	if len(secret) < 16 {
		return nil, nil, errors.New("job secret is shorter than 16 bytes")
	}
	seed, err := hkdf.Key(sha256.New, secret, []byte("gorun job CA salt v1"), "gorun job CA ed25519 seed", ed25519.SeedSize)
	if err != nil {
		return nil, nil, err
	}
	key := ed25519.NewKeyFromSeed(seed)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gorun job CA"},
		NotBefore:             time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return key, cert, err
}

// newJobAuth issues a leaf certificate named label ("rank 3", "rendezvous")
// signed by the job CA.
func newJobAuth(secret []byte, label string) (*jobAuth, error) {
	caKey, caCert, err := deriveCA(secret)
	if err != nil {
		return nil, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: label},
		DNSNames:     []string{serverName},
		NotBefore:    now.Add(-24 * time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, pub, caKey)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return &jobAuth{
		pool:  pool,
		leaf:  tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv},
		label: label,
	}, nil
}

// serverTLS requires and verifies a client certificate from the job CA.
func (a *jobAuth) serverTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.leaf},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    a.pool,
		NextProtos:   []string{ALPN},
	}
}

// clientTLS presents our certificate and verifies the server against the job CA.
func (a *jobAuth) clientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.leaf},
		RootCAs:      a.pool,
		ServerName:   serverName,
		NextProtos:   []string{ALPN},
	}
}

// peerLabel returns the common name of the verified peer certificate.
func peerLabel(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return cs.PeerCertificates[0].Subject.CommonName
}

func rankLabel(r int) string { return "rank " + strconv.Itoa(r) }

// labelRank parses "rank N"; -1 if the label is not a rank's.
func labelRank(label string) int {
	s, ok := strings.CutPrefix(label, "rank ")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// explainHandshake turns a TLS/QUIC handshake failure into a sentence a user
// can act on.
func explainHandshake(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "no application protocol"):
		return fmt.Errorf("protocol mismatch: the peer does not speak %s (a different gorun version?): %v", ALPN, err)
	case strings.Contains(msg, "certificate") || strings.Contains(msg, "bad certificate") || strings.Contains(msg, "unknown authority"):
		return fmt.Errorf("authentication failed: the peer does not hold this job's secret: %v", err)
	}
	return err
}
