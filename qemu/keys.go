package qemu

import (
	"fmt"
	"sort"
	"strings"

	"github.com/qemu-mcp/qemu-mcp/internal/advice"
)

// qcodes are QEMU 7.2's QKeyCode names (query-qmp-schema), the key names
// send-key accepts.
var qcodes = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range strings.Fields("unmapped shift shift_r alt alt_r ctrl ctrl_r menu esc 1 2 3 4 5 6 7 8 9 0 minus equal backspace tab q w e r t y u i o p bracket_left bracket_right ret a s d f g h j k l semicolon apostrophe grave_accent backslash z x c v b n m comma dot slash asterisk spc caps_lock f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 num_lock scroll_lock kp_divide kp_multiply kp_subtract kp_add kp_enter kp_decimal sysrq kp_0 kp_1 kp_2 kp_3 kp_4 kp_5 kp_6 kp_7 kp_8 kp_9 less f11 f12 print home pgup pgdn end left up down right insert delete stop again props undo front copy open paste find cut lf help meta_l meta_r compose pause ro hiragana henkan yen muhenkan katakanahiragana kp_comma kp_equals power sleep wake audionext audioprev audiostop audioplay audiomute volumeup volumedown mediaselect mail calculator computer ac_home ac_back ac_forward ac_refresh ac_bookmarks lang1 lang2") {
		m[k] = true
	}
	return m
}()

// keyAliases are the names people type for keys whose qcode differs.
var keyAliases = map[string]string{
	"control": "ctrl", "enter": "ret", "return": "ret", "space": "spc", "del": "delete",
	"escape": "esc", "pageup": "pgup", "pagedown": "pgdn", "win": "meta_l", "super": "meta_l",
	"printscreen": "print", "capslock": "caps_lock", "bksp": "backspace",
}

// ParseKeys turns a key combination such as "ctrl-alt-delete", "shift-a" or
// "ret" into QEMU key codes, pressed together. A literal minus is "minus".
func ParseKeys(combo string) ([]string, error) {
	combo = strings.TrimSpace(strings.ToLower(combo))
	if combo == "" {
		return nil, fmt.Errorf("keys is empty: give a combination such as ctrl-alt-delete, shift-a or ret")
	}
	var keys []string
	for _, k := range strings.Split(combo, "-") {
		if a, ok := keyAliases[k]; ok {
			k = a
		}
		if !qcodes[k] {
			return nil, fmt.Errorf("key %q in %q is not a QEMU key name; use names like ctrl, alt, shift, ret, spc, esc, tab, delete, f1, a, 1, minus (see QKeyCode in QEMU's QMP reference)", k, combo)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// usKey is the key that types a character and whether shift is held.
type usKey struct {
	key   string
	shift bool
}

// usLayout maps printable ASCII on a US keyboard.
var usLayout = func() map[rune]usKey {
	m := map[rune]usKey{}
	for c := 'a'; c <= 'z'; c++ {
		m[c] = usKey{string(c), false}
		m[c-'a'+'A'] = usKey{string(c), true}
	}
	plain := map[rune]string{'1': "1", '2': "2", '3': "3", '4': "4", '5': "5", '6': "6", '7': "7", '8': "8", '9': "9", '0': "0",
		'-': "minus", '=': "equal", '[': "bracket_left", ']': "bracket_right", '\\': "backslash", ';': "semicolon",
		'\'': "apostrophe", '`': "grave_accent", ',': "comma", '.': "dot", '/': "slash", ' ': "spc", '\n': "ret", '\t': "tab"}
	shifted := map[rune]string{'!': "1", '@': "2", '#': "3", '$': "4", '%': "5", '^': "6", '&': "7", '*': "8", '(': "9", ')': "0",
		'_': "minus", '+': "equal", '{': "bracket_left", '}': "bracket_right", '|': "backslash", ':': "semicolon",
		'"': "apostrophe", '~': "grave_accent", '<': "comma", '>': "dot", '?': "slash"}
	for r, k := range plain {
		m[r] = usKey{k, false}
	}
	for r, k := range shifted {
		m[r] = usKey{k, true}
	}
	return m
}()

// TypeText turns text into key combinations on a US layout, one per
// character. Characters with no key are all named in the error, so nothing
// is typed at all rather than half a line.
func TypeText(text string) ([][]string, error) {
	var out [][]string
	bad := map[string]bool{}
	for _, r := range text {
		k, ok := usLayout[r]
		if !ok {
			bad[fmt.Sprintf("%q", r)] = true
			continue
		}
		if k.shift {
			out = append(out, []string{"shift", k.key})
		} else {
			out = append(out, []string{k.key})
		}
	}
	if len(bad) > 0 {
		names := make([]string, 0, len(bad))
		for n := range bad {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, &LayoutError{Chars: names}
	}
	return out, nil
}

// LayoutError is text with characters a US keyboard layout cannot type;
// nothing was typed.
type LayoutError struct {
	// Chars are the characters, named and sorted.
	Chars []string
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("cannot type %s on a US keyboard layout: nothing was typed", strings.Join(e.Chars, ", "))
}

// Advice is what a caller can do: press the keys, or type on the console.
func (e *LayoutError) Advice() advice.Advice { return advice.Advice{Action: advice.KeysOrConsole} }
