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
	"sync"
	"time"
)

// ALPN is the application protocol (and its version) every gorun endpoint
// speaks. A peer that speaks another version fails the handshake with a
// clear error.
const ALPN = "gorun/1"

// ALPNAegis is the same protocol with the TLS/TCP lanes' records sealed
// with AEGIS-128X4 instead of AES-128-GCM (sealed.go). A mesh offers it
// first where this CPU runs AEGIS-128X4 and GORUN_TCP_CIPHER allows it;
// the server takes the first of its protocols that the client offers, so
// two such ends seal with AEGIS and every other pair with AES-GCM.
const ALPNAegis = ALPN + "+aegis128x4"

const serverName = "gorun"

// caName is the common name of every job's CA (each job's is a different
// key, derived from its secret).
const caName = "gorun job CA"

// jobAuth holds the TLS material of one endpoint: the job CA, derived from
// the job secret so that every holder of the secret derives the same one,
// and a leaf certificate this process issued itself.
type jobAuth struct {
	pool  *x509.CertPool
	leaf  tls.Certificate
	label string
	// protos are the application protocols offered, in order of
	// preference: ALPN, and before it ALPNAegis where the mesh may seal
	// with AEGIS (Mesh.Connect sets them).
	protos []string
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
		Subject:               pkix.Name{CommonName: caName},
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
		pool:   pool,
		leaf:   tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv},
		label:  label,
		protos: []string{ALPN},
	}, nil
}

// serverTLS asks every client for its certificate and accepts only one
// issued by the job CA, that is by a holder of the job secret. It checks
// the certificate itself (checkPeer, the check crypto/tls's
// RequireAndVerifyClientCert makes) in VerifyConnection, which runs for
// every handshake, one without a certificate too, so that each refusal is
// recorded in rec with its reason and the client's address instead of
// vanishing inside the TLS stack.
func (a *jobAuth) serverTLS(rec *refusals) *tls.Config {
	base := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.leaf},
		// Request, not require: a client without a certificate reaches
		// VerifyConnection, which refuses it.
		ClientAuth: tls.RequestClientCert,
		// No resumption: every connection shows its certificate.
		SessionTicketsDisabled: true,
		NextProtos:             a.protos,
	}
	verify := func(from string) func(tls.ConnectionState) error {
		return func(cs tls.ConnectionState) error {
			if err := a.checkPeer(cs.PeerCertificates); err != nil {
				err.from = from
				rec.add(err)
				return err
			}
			return nil
		}
	}
	base.VerifyConnection = verify("")
	base.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.GetConfigForClient = nil
		if hello.Conn != nil && hello.Conn.RemoteAddr() != nil {
			c.VerifyConnection = verify(hello.Conn.RemoteAddr().String())
		}
		return c, nil
	}
	return base
}

// clientTLS presents our certificate and verifies the server against the job CA.
func (a *jobAuth) clientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.leaf},
		RootCAs:      a.pool,
		ServerName:   serverName,
		NextProtos:   a.protos,
	}
}

// peerLabel returns the common name of the verified peer certificate.
func peerLabel(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return cs.PeerCertificates[0].Subject.CommonName
}

// name is the endpoint in messages: "rank 3", "the rendezvous".
func (a *jobAuth) name() string {
	if a.label == "rendezvous" {
		return "the rendezvous"
	}
	return a.label
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

// Why a certificate is refused.
const (
	noCertificate    = "no certificate"
	otherJob         = "another job"
	unknownAuthority = "unknown authority"
	badCertificate   = "invalid certificate"
	wrongPeer        = "wrong peer"
)

// authError is a peer this endpoint refused to talk to: its certificate
// (or the lack of one) does not show that it holds the job secret, or it
// is not the peer expected. On the refusing server it names the client's
// address (from) and is recorded (refusals); on a client it explains a
// failed dial.
type authError struct {
	by     string // the endpoint that refused: "rank 1", "the rendezvous"
	from   string // the peer's address, where known
	reason string // noCertificate, otherJob, ...
	msg    string // the reason in words, about the peer ("it ...")
}

func (e *authError) Error() string {
	var b strings.Builder
	if e.by != "" {
		b.WriteString(e.by + " refused ")
	} else {
		b.WriteString("refused ")
	}
	if e.from != "" {
		b.WriteString("a connection from " + e.from)
	} else {
		b.WriteString("a connection")
	}
	return b.String() + ": " + e.msg
}

// checkPeer accepts a certificate chain issued by the job CA for client
// and server use, and explains any other.
func (a *jobAuth) checkPeer(certs []*x509.Certificate) *authError {
	if len(certs) == 0 {
		return &authError{by: a.name(), reason: noCertificate, msg: "it presented no certificate"}
	}
	leaf := certs[0]
	opts := x509.VerifyOptions{
		Roots:         a.pool,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	_, err := leaf.Verify(opts)
	if err == nil {
		return nil
	}
	e := &authError{by: a.name()}
	e.reason, e.msg = classifyCert(leaf, err)
	return e
}

// classifyCert names why leaf failed verification against a job CA.
func classifyCert(leaf *x509.Certificate, err error) (reason, msg string) {
	cn := leaf.Subject.CommonName
	var ua x509.UnknownAuthorityError
	switch {
	case errors.As(err, &ua) && leaf.Issuer.CommonName == caName:
		return otherJob, fmt.Sprintf("its certificate (%q) is from another gorun job: it holds a different job secret", cn)
	case errors.As(err, &ua):
		return unknownAuthority, fmt.Sprintf("its certificate (%q, issued by %q) is from an unknown authority, not a gorun job CA", cn, leaf.Issuer.CommonName)
	}
	return badCertificate, fmt.Sprintf("its certificate (%q) is not valid for this job: %v", cn, err)
}

// refusals keeps the last connections an endpoint refused, for the error
// of a rank whose peer never arrived and for tests.
type refusals struct {
	mu   sync.Mutex
	n    int
	last []*authError
}

const refusalsKept = 16

func (r *refusals) add(e *authError) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if len(r.last) == refusalsKept {
		r.last = append(r.last[:0], r.last[1:]...)
	}
	r.last = append(r.last, e)
}

// list returns the refusals kept, oldest first, and how many there were.
func (r *refusals) list() ([]*authError, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*authError(nil), r.last...), r.n
}

// summary is "" or a clause citing the last refusal.
func (r *refusals) summary() string {
	l, n := r.list()
	if n == 0 {
		return ""
	}
	if n == 1 {
		return fmt.Sprintf("; it refused a connection: %v", l[0])
	}
	return fmt.Sprintf("; it refused %d connections, the last: %v", n, l[len(l)-1])
}

// explainHandshake turns a TLS/QUIC handshake failure on the dialing side
// into a sentence a user can act on: the server's certificate failed our
// check (and why), or the server refused ours.
func explainHandshake(err error) error {
	var ve *tls.CertificateVerificationError
	if errors.As(err, &ve) && len(ve.UnverifiedCertificates) > 0 {
		_, msg := classifyCert(ve.UnverifiedCertificates[0], ve.Err)
		return fmt.Errorf("authentication failed: %s", msg)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "no application protocol"):
		return fmt.Errorf("protocol mismatch: the peer does not speak %s (a different gorun version?): %w", ALPN, err)
	case remoteRefusal(msg):
		return fmt.Errorf("authentication failed: the peer refused this process's certificate (are the job secrets the same?): %w", err)
	case strings.Contains(msg, "certificate") || strings.Contains(msg, "unknown authority"):
		return fmt.Errorf("authentication failed: the peer does not hold this job's secret: %w", err)
	}
	return err
}

// remoteRefusal reports whether msg is a TLS alert with which the peer
// refused our certificate.
func remoteRefusal(msg string) bool {
	return strings.Contains(msg, "remote error: tls: bad certificate") ||
		strings.Contains(msg, "(remote): tls: bad certificate") ||
		strings.Contains(msg, "remote error: tls: certificate required") ||
		strings.Contains(msg, "(remote): tls: certificate required")
}
