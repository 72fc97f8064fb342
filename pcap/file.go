package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// The classic pcap file format (what tcpdump -w writes, and libpcap,
// Wireshark and QEMU's filter-dump read and write): a 24-byte file header,
// then per packet a 16-byte record header and the captured bytes. Files
// written here are little-endian with microsecond time stamps; files read
// may be either byte order, in microseconds or nanoseconds.
const (
	magicMicro       = 0xa1b2c3d4
	magicNano        = 0xa1b23c4d
	versionMajor     = 2
	versionMinor     = 4
	linkTypeEthernet = 1

	fileHeaderLen   = 24
	recordHeaderLen = 16
)

// fileHeader is the header of a file of Ethernet frames of at most
// snaplen bytes each.
func fileHeader(snaplen int) []byte {
	b := make([]byte, fileHeaderLen)
	binary.LittleEndian.PutUint32(b[0:4], magicMicro)
	binary.LittleEndian.PutUint16(b[4:6], versionMajor)
	binary.LittleEndian.PutUint16(b[6:8], versionMinor)
	// Time zone offset and accuracy stay 0.
	binary.LittleEndian.PutUint32(b[16:20], uint32(snaplen))
	binary.LittleEndian.PutUint32(b[20:24], linkTypeEthernet)
	return b
}

// appendRecord appends one packet's record: captured data of a frame that
// was length bytes long on the wire.
func appendRecord(b []byte, t time.Time, length int, data []byte) []byte {
	var h [recordHeaderLen]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(t.Unix()))
	binary.LittleEndian.PutUint32(h[4:8], uint32(t.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(h[8:12], uint32(len(data)))
	binary.LittleEndian.PutUint32(h[12:16], uint32(max(length, len(data))))
	return append(append(b, h[:]...), data...)
}

// recordInfo is a record's header.
type recordInfo struct {
	time   time.Time
	length int // on the wire
}

// maxRecord bounds a record the reader takes, whatever the file's snap
// length says: libpcap's maximum snap length (writers that do not cut
// records to the snap length they declare are read up to it, as tcpdump
// and Wireshark do; a larger one is a broken file, not a reason to
// allocate gigabytes).
const maxRecord = MaxSnaplen

// reader reads the records of a pcap file or stream.
type reader struct {
	r        *bufio.Reader
	order    binary.ByteOrder
	nano     bool
	snaplen  int
	linkType uint32
	hdr      [recordHeaderLen]byte
	buf      []byte
}

// errNotPcap means the header is not a pcap file's.
var errNotPcap = errors.New("not a pcap file")

// newReader reads the file header: io.EOF or io.ErrUnexpectedEOF if it is
// not all there (yet), errNotPcap if it is not one.
func newReader(r io.Reader) (*reader, error) {
	rd := &reader{r: bufio.NewReaderSize(r, 64<<10)}
	var h [fileHeaderLen]byte
	if _, err := io.ReadFull(rd.r, h[:]); err != nil {
		return nil, err
	}
	switch {
	case binary.LittleEndian.Uint32(h[0:4]) == magicMicro:
		rd.order = binary.LittleEndian
	case binary.BigEndian.Uint32(h[0:4]) == magicMicro:
		rd.order = binary.BigEndian
	case binary.LittleEndian.Uint32(h[0:4]) == magicNano:
		rd.order, rd.nano = binary.LittleEndian, true
	case binary.BigEndian.Uint32(h[0:4]) == magicNano:
		rd.order, rd.nano = binary.BigEndian, true
	default:
		return nil, errNotPcap
	}
	if rd.order.Uint16(h[4:6]) != versionMajor || rd.order.Uint16(h[6:8]) != versionMinor {
		return nil, fmt.Errorf("%w: version %d.%d", errNotPcap, rd.order.Uint16(h[4:6]), rd.order.Uint16(h[6:8]))
	}
	rd.snaplen = int(rd.order.Uint32(h[16:20]))
	rd.linkType = rd.order.Uint32(h[20:24])
	return rd, nil
}

// next reads the next record; its data is valid until the next call.
// io.EOF at the end, io.ErrUnexpectedEOF for a record cut short.
func (rd *reader) next() ([]byte, recordInfo, error) {
	var ri recordInfo
	if _, err := io.ReadFull(rd.r, rd.hdr[:]); err != nil {
		return nil, ri, err
	}
	sec, frac := rd.order.Uint32(rd.hdr[0:4]), rd.order.Uint32(rd.hdr[4:8])
	if !rd.nano {
		frac *= 1000
	}
	ri.time = time.Unix(int64(sec), int64(frac)).UTC()
	caplen := int(rd.order.Uint32(rd.hdr[8:12]))
	ri.length = int(rd.order.Uint32(rd.hdr[12:16]))
	if caplen > maxRecord {
		return nil, ri, fmt.Errorf("capture length exceeds the largest snap length: %d > %d", caplen, maxRecord)
	}
	if caplen > ri.length {
		return nil, ri, fmt.Errorf("capture length exceeds original packet length: %d > %d", caplen, ri.length)
	}
	if cap(rd.buf) < caplen {
		rd.buf = make([]byte, caplen)
	}
	rd.buf = rd.buf[:caplen]
	if _, err := io.ReadFull(rd.r, rd.buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, ri, err
	}
	return rd.buf, ri, nil
}
