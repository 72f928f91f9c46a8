// Package capmodel holds the types the capacity packages share: the
// reservation row, its states, bindings and conditions, where it is placed,
// atom kinds and the kernel CPU-list form. It is a leaf: it imports no other
// capacity package and runs no SQL, so atoms, placer and reservation can all
// import it and only ever import one way.
package capmodel
