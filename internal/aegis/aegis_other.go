//go:build !amd64

package aegis

const vector = false

const noVector = "aegis: no vector code on this architecture"

func start(*state, *[rate]byte, *[16 * lanes]byte) { panic(noVector) }
func finish(*state, *[TagSize]byte, *[16]byte)     { panic(noVector) }
func update(*state, *[rate]byte)                   { panic(noVector) }
func keystream(*state, *[rate]byte)                { panic(noVector) }
func encBlocks(*state, *byte, *byte, int)          { panic(noVector) }
func decBlocks(*state, *byte, *byte, int)          { panic(noVector) }
