package reaper

import "github.com/qemu-mcp/qemu-mcp/internal/names"

// FileType is a file's type as Lstat sees it (a symlink is never followed).
type FileType string

// The file types.
const (
	TypeFIFO    FileType = "fifo"
	TypeSocket  FileType = "socket"
	TypeRegular FileType = "regular file"
	TypeSymlink FileType = "symlink"
	TypeDir     FileType = "directory"
	TypeOther   FileType = "other"
)

// Want returns the only file type an entry of kind k may be removed as.
func Want(k names.Kind) FileType {
	switch k {
	case names.SerialIn, names.SerialOut, names.CaptureFIFO:
		return TypeFIFO
	case names.QMPSocket, names.GDBSocket, names.VNCSocket:
		return TypeSocket
	case names.Record, names.RecordTemp, names.SnapshotStage, names.ReplayStage, names.ReplayConsole:
		return TypeRegular
	case names.ProbeDir:
		return TypeDir
	}
	return ""
}
