//go:build !amd64

package aesgcm

import "crypto/cipher"

const vector = false

func newVector([]byte) cipher.AEAD { panic("aesgcm: no vector code on this architecture") }
