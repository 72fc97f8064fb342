// Package shellwords splits a command line into words as a POSIX shell
// reads them, for the one thing the server takes from a shell's syntax: a
// project's QEMU invocation as its Makefile or script prints it. Quoting,
// backslash escapes and line continuations are honoured; anything a shell
// would run or expand (variables, command substitution, pipes, redirects,
// several commands) is an error that names it, since the server runs no
// shell and must not guess what the line meant.
package shellwords

import (
	"fmt"
	"strings"
)

// SyntaxError is a line Split cannot take word for word.
type SyntaxError struct {
	// Offset is the byte of the line where the problem is.
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("at byte %d: %s", e.Offset, e.Msg) }

// Split returns the words of line. A backslash before a newline joins
// the lines (a continuation); a '#' that begins a word starts a comment
// up to the end of its line.
func Split(line string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word (quotes make empty words)
	)
	end := func() {
		if in {
			words = append(words, cur.String())
			cur.Reset()
			in = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			end()
		case c == '\\':
			if i+1 >= len(line) {
				return nil, &SyntaxError{i, "the line ends in a lone backslash"}
			}
			i++
			if line[i] == '\n' {
				continue // a continuation
			}
			if line[i] == '\r' && i+1 < len(line) && line[i+1] == '\n' {
				i++
				continue
			}
			cur.WriteByte(line[i])
			in = true
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, &SyntaxError{i, "a single quote is not closed"}
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			in = true
		case c == '"':
			j, err := double(line, i+1, &cur)
			if err != nil {
				return nil, err
			}
			i = j
			in = true
		case c == '#' && !in:
			for i < len(line) && line[i] != '\n' {
				i++
			}
		case strings.IndexByte("|&;<>()`$", c) >= 0:
			return nil, &SyntaxError{i, fmt.Sprintf("%q is shell syntax (a pipe, redirect, expansion or second command): give QEMU's words only, as the shell would pass them", string(c))}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	end()
	return words, nil
}

// double reads a double-quoted string from line[i:] (after the opening
// quote) into b and returns the index of the closing quote.
func double(line string, i int, b *strings.Builder) (int, error) {
	start := i - 1
	for ; i < len(line); i++ {
		switch c := line[i]; c {
		case '"':
			return i, nil
		case '\\':
			if i+1 < len(line) {
				switch n := line[i+1]; n {
				case '\n':
					i++
					continue
				case '"', '\\', '$', '`':
					b.WriteByte(n)
					i++
					continue
				}
			}
			b.WriteByte(c)
		case '$', '`':
			return 0, &SyntaxError{i, fmt.Sprintf("%q inside double quotes is a shell expansion: give its value", string(c))}
		default:
			b.WriteByte(c)
		}
	}
	return 0, &SyntaxError{start, "a double quote is not closed"}
}

// Join quotes words so that Split gives them back: plain words as they
// are, others in single quotes.
func Join(words []string) string {
	var b strings.Builder
	for i, w := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(Quote(w))
	}
	return b.String()
}

// Quote is w as one shell word.
func Quote(w string) string {
	if w == "" {
		return "''"
	}
	plain := true
	for _, c := range w {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_=,./:+@%^", c)) {
			plain = false
			break
		}
	}
	if plain {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}
