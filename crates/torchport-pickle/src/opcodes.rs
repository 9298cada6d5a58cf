//! Owns the pickle opcode bytes (named as in Python's `pickletools`) and their names.

/// `(`: push a mark onto the stack (protocol 0).
pub const MARK: u8 = b'(';
/// `.`: every pickle ends with STOP; the top of the stack is the result.
pub const STOP: u8 = b'.';
/// `0`: discard the top stack item (or the topmost mark when no item is above it).
pub const POP: u8 = b'0';
/// `1`: discard the stack through the topmost mark.
pub const POP_MARK: u8 = b'1';
/// `2`: push the top stack item again.
pub const DUP: u8 = b'2';
/// `F`: float as a decimal text line (protocol 0).
pub const FLOAT: u8 = b'F';
/// `I`: integer as a decimal text line; `01`/`00` mean True/False (protocol 0).
pub const INT: u8 = b'I';
/// `J`: 4-byte signed little-endian integer (protocol 1).
pub const BININT: u8 = b'J';
/// `K`: 1-byte unsigned integer (protocol 1).
pub const BININT1: u8 = b'K';
/// `M`: 2-byte unsigned little-endian integer (protocol 1).
pub const BININT2: u8 = b'M';
/// `L`: long integer as a decimal text line with an optional `L` suffix (protocol 0).
pub const LONG: u8 = b'L';
/// `\x8a`: long integer, 1-byte length then two's-complement little-endian bytes (protocol 2).
pub const LONG1: u8 = 0x8a;
/// `\x8b`: long integer, 4-byte signed length then two's-complement bytes (protocol 2).
pub const LONG4: u8 = 0x8b;
/// `N`: push None.
pub const NONE: u8 = b'N';
/// `P`: persistent id as a text line (protocol 0).
pub const PERSID: u8 = b'P';
/// `Q`: persistent id taken from the stack (protocol 1).
pub const BINPERSID: u8 = b'Q';
/// `R`: call the callable below the top with the argument tuple on top.
pub const REDUCE: u8 = b'R';
/// `S`: Python 2 str as a quoted, escaped text line (protocol 0).
pub const STRING: u8 = b'S';
/// `T`: Python 2 str with a 4-byte signed length (protocol 1).
pub const BINSTRING: u8 = b'T';
/// `U`: Python 2 str with a 1-byte length (protocol 1).
pub const SHORT_BINSTRING: u8 = b'U';
/// `V`: str as a raw-unicode-escape text line (protocol 0).
pub const UNICODE: u8 = b'V';
/// `X`: UTF-8 str with a 4-byte length (protocol 1).
pub const BINUNICODE: u8 = b'X';
/// `\x8c`: UTF-8 str with a 1-byte length (protocol 4).
pub const SHORT_BINUNICODE: u8 = 0x8c;
/// `\x8d`: UTF-8 str with an 8-byte length (protocol 4).
pub const BINUNICODE8: u8 = 0x8d;
/// `B`: bytes with a 4-byte length (protocol 3).
pub const BINBYTES: u8 = b'B';
/// `C`: bytes with a 1-byte length (protocol 3).
pub const SHORT_BINBYTES: u8 = b'C';
/// `\x8e`: bytes with an 8-byte length (protocol 4).
pub const BINBYTES8: u8 = 0x8e;
/// `\x96`: bytearray with an 8-byte length (protocol 5).
pub const BYTEARRAY8: u8 = 0x96;
/// `\x97`: push the next out-of-band buffer (protocol 5).
pub const NEXT_BUFFER: u8 = 0x97;
/// `\x98`: make the top buffer read-only (protocol 5).
pub const READONLY_BUFFER: u8 = 0x98;
/// `a`: append the top item to the list below it.
pub const APPEND: u8 = b'a';
/// `e`: extend the list below the mark with the items above it.
pub const APPENDS: u8 = b'e';
/// `b`: apply the top item as state to the object below it (`__setstate__`).
pub const BUILD: u8 = b'b';
/// `c`: push a global named by two text lines, module and name.
pub const GLOBAL: u8 = b'c';
/// `\x93`: push a global named by the two str items on the stack (protocol 4).
pub const STACK_GLOBAL: u8 = 0x93;
/// `d`: build a dict from the key/value pairs above the mark.
pub const DICT: u8 = b'd';
/// `}`: push an empty dict (protocol 1).
pub const EMPTY_DICT: u8 = b'}';
/// `l`: build a list from the items above the mark.
pub const LIST: u8 = b'l';
/// `]`: push an empty list (protocol 1).
pub const EMPTY_LIST: u8 = b']';
/// `t`: build a tuple from the items above the mark.
pub const TUPLE: u8 = b't';
/// `)`: push an empty tuple (protocol 1).
pub const EMPTY_TUPLE: u8 = b')';
/// `\x85`: build a 1-tuple from the top item (protocol 2).
pub const TUPLE1: u8 = 0x85;
/// `\x86`: build a 2-tuple from the top two items (protocol 2).
pub const TUPLE2: u8 = 0x86;
/// `\x87`: build a 3-tuple from the top three items (protocol 2).
pub const TUPLE3: u8 = 0x87;
/// `s`: set `dict[key] = value` with the top two items on the dict below them.
pub const SETITEM: u8 = b's';
/// `u`: add the key/value pairs above the mark to the dict below it.
pub const SETITEMS: u8 = b'u';
/// `\x8f`: push an empty set (protocol 4).
pub const EMPTY_SET: u8 = 0x8f;
/// `\x90`: add the items above the mark to the set below it (protocol 4).
pub const ADDITEMS: u8 = 0x90;
/// `\x91`: build a frozenset from the items above the mark (protocol 4).
pub const FROZENSET: u8 = 0x91;
/// `i`: instantiate the class named by two text lines with the items above the mark.
pub const INST: u8 = b'i';
/// `o`: instantiate the class that is the first item above the mark (protocol 1).
pub const OBJ: u8 = b'o';
/// `\x81`: `cls.__new__(cls, *args)` (protocol 2).
pub const NEWOBJ: u8 = 0x81;
/// `\x92`: `cls.__new__(cls, *args, **kwargs)` (protocol 4).
pub const NEWOBJ_EX: u8 = 0x92;
/// `g`: push a memo entry named by a decimal text line.
pub const GET: u8 = b'g';
/// `h`: push a memo entry with a 1-byte key (protocol 1).
pub const BINGET: u8 = b'h';
/// `j`: push a memo entry with a 4-byte key (protocol 1).
pub const LONG_BINGET: u8 = b'j';
/// `p`: store the top item in the memo under a decimal text key.
pub const PUT: u8 = b'p';
/// `q`: store the top item in the memo under a 1-byte key (protocol 1).
pub const BINPUT: u8 = b'q';
/// `r`: store the top item in the memo under a 4-byte key (protocol 1).
pub const LONG_BINPUT: u8 = b'r';
/// `\x94`: store the top item in the memo under the next free key (protocol 4).
pub const MEMOIZE: u8 = 0x94;
/// `G`: 8-byte big-endian IEEE double (protocol 1).
pub const BINFLOAT: u8 = b'G';
/// `\x88`: push True (protocol 2).
pub const NEWTRUE: u8 = 0x88;
/// `\x89`: push False (protocol 2).
pub const NEWFALSE: u8 = 0x89;
/// `\x80`: protocol version header (protocol 2).
pub const PROTO: u8 = 0x80;
/// `\x95`: frame header with an 8-byte frame length (protocol 4).
pub const FRAME: u8 = 0x95;
/// `\x82`: push an object from the extension registry, 1-byte code (protocol 2).
pub const EXT1: u8 = 0x82;
/// `\x83`: push an object from the extension registry, 2-byte code (protocol 2).
pub const EXT2: u8 = 0x83;
/// `\x84`: push an object from the extension registry, 4-byte code (protocol 2).
pub const EXT4: u8 = 0x84;

/// The `pickletools` name of an opcode byte, or `None` when the byte is no opcode.
pub fn name(op: u8) -> Option<&'static str> {
    Some(match op {
        MARK => "MARK",
        STOP => "STOP",
        POP => "POP",
        POP_MARK => "POP_MARK",
        DUP => "DUP",
        FLOAT => "FLOAT",
        INT => "INT",
        BININT => "BININT",
        BININT1 => "BININT1",
        BININT2 => "BININT2",
        LONG => "LONG",
        LONG1 => "LONG1",
        LONG4 => "LONG4",
        NONE => "NONE",
        PERSID => "PERSID",
        BINPERSID => "BINPERSID",
        REDUCE => "REDUCE",
        STRING => "STRING",
        BINSTRING => "BINSTRING",
        SHORT_BINSTRING => "SHORT_BINSTRING",
        UNICODE => "UNICODE",
        BINUNICODE => "BINUNICODE",
        SHORT_BINUNICODE => "SHORT_BINUNICODE",
        BINUNICODE8 => "BINUNICODE8",
        BINBYTES => "BINBYTES",
        SHORT_BINBYTES => "SHORT_BINBYTES",
        BINBYTES8 => "BINBYTES8",
        BYTEARRAY8 => "BYTEARRAY8",
        NEXT_BUFFER => "NEXT_BUFFER",
        READONLY_BUFFER => "READONLY_BUFFER",
        APPEND => "APPEND",
        APPENDS => "APPENDS",
        BUILD => "BUILD",
        GLOBAL => "GLOBAL",
        STACK_GLOBAL => "STACK_GLOBAL",
        DICT => "DICT",
        EMPTY_DICT => "EMPTY_DICT",
        LIST => "LIST",
        EMPTY_LIST => "EMPTY_LIST",
        TUPLE => "TUPLE",
        EMPTY_TUPLE => "EMPTY_TUPLE",
        TUPLE1 => "TUPLE1",
        TUPLE2 => "TUPLE2",
        TUPLE3 => "TUPLE3",
        SETITEM => "SETITEM",
        SETITEMS => "SETITEMS",
        EMPTY_SET => "EMPTY_SET",
        ADDITEMS => "ADDITEMS",
        FROZENSET => "FROZENSET",
        INST => "INST",
        OBJ => "OBJ",
        NEWOBJ => "NEWOBJ",
        NEWOBJ_EX => "NEWOBJ_EX",
        GET => "GET",
        BINGET => "BINGET",
        LONG_BINGET => "LONG_BINGET",
        PUT => "PUT",
        BINPUT => "BINPUT",
        LONG_BINPUT => "LONG_BINPUT",
        MEMOIZE => "MEMOIZE",
        BINFLOAT => "BINFLOAT",
        NEWTRUE => "NEWTRUE",
        NEWFALSE => "NEWFALSE",
        PROTO => "PROTO",
        FRAME => "FRAME",
        EXT1 => "EXT1",
        EXT2 => "EXT2",
        EXT4 => "EXT4",
        _ => return None,
    })
}

/// Every opcode byte, in `pickletools` order (used by tests and fuzzers).
pub const ALL: [u8; 68] = [
    INT,
    BININT,
    BININT1,
    BININT2,
    LONG,
    LONG1,
    LONG4,
    STRING,
    BINSTRING,
    SHORT_BINSTRING,
    BINBYTES,
    SHORT_BINBYTES,
    BINBYTES8,
    BYTEARRAY8,
    NEXT_BUFFER,
    READONLY_BUFFER,
    NONE,
    NEWTRUE,
    NEWFALSE,
    UNICODE,
    SHORT_BINUNICODE,
    BINUNICODE,
    BINUNICODE8,
    FLOAT,
    BINFLOAT,
    EMPTY_LIST,
    APPEND,
    APPENDS,
    LIST,
    EMPTY_TUPLE,
    TUPLE,
    TUPLE1,
    TUPLE2,
    TUPLE3,
    EMPTY_DICT,
    DICT,
    SETITEM,
    SETITEMS,
    EMPTY_SET,
    ADDITEMS,
    FROZENSET,
    POP,
    DUP,
    MARK,
    POP_MARK,
    GET,
    BINGET,
    LONG_BINGET,
    PUT,
    BINPUT,
    LONG_BINPUT,
    MEMOIZE,
    EXT1,
    EXT2,
    EXT4,
    GLOBAL,
    STACK_GLOBAL,
    REDUCE,
    BUILD,
    INST,
    OBJ,
    NEWOBJ,
    NEWOBJ_EX,
    PROTO,
    STOP,
    FRAME,
    PERSID,
    BINPERSID,
];

#[cfg(test)]
mod tests {
    #[test]
    fn every_opcode_is_named_once() {
        let mut seen = std::collections::HashSet::new();
        for op in super::ALL {
            assert!(super::name(op).is_some(), "0x{op:02x}");
            assert!(seen.insert(op), "0x{op:02x} listed twice");
        }
        let named = (0..=255u8).filter(|&b| super::name(b).is_some()).count();
        assert_eq!(named, super::ALL.len());
    }
}
