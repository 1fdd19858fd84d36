"""An LMS's table file, read and written back byte for byte except the cells changed.

Canvas, Moodle and Blackboard download their gradebooks as delimited text (comma, tab or
semicolon; UTF-8 or UTF-16 with or without a byte order mark, or a spreadsheet's re-save in
Windows-1252 or Mac Roman; any line ending). It is the one decoder of every LMS table the grader
reads (a gradebook, Moodle's worksheet and its times). :func:`read_table`
keeps each record's raw text and where its cells are; :func:`write_table` writes the file again
with only the chosen cells replaced, so that every other byte reaches the LMS as it left it.
"""
from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path



__all__ = ["ExportError", "Record", "Table", "read_table", "write_table", "delimiter_of", "BOMS"]

BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_ENDING = re.compile(r"(?:\r\n|\r|\n)\Z")


class ExportError(ValueError):
    """The gradebook or grades.csv cannot be read, or holds nothing this export can fill."""


# ------------------------------------------------------------------ delimited files, kept raw

@dataclass
class Record:
    """One CSV record: its cells' values and where it and each cell's raw text lie in the file."""
    values: list
    spans: list          # (start, end) in Table.text of each cell, quotes included; None: unknown
    start: int           # the record in Table.text[start:end], without its line ending
    end: int
    line: int            # 1-based line the record starts on


@dataclass
class Table:
    """A delimited text file read so that it can be written back changed in single cells."""
    path: Path
    text: str
    bom: bytes
    codec: str
    delimiter: str
    records: list = field(default_factory=list)
    quote_all: bool = False     # the header quotes every cell (Blackboard): so does a rewritten row

    def header(self) -> list:
        return self.records[0].values if self.records else []


def _decode(data: bytes, path: Path) -> tuple:
    for bom, codec in BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom):].decode(codec), bom, codec
            except UnicodeDecodeError as exc:
                raise ExportError(f"{path}: starts with a {codec} byte order mark but is not "
                                  f"{codec} ({exc})") from None
    # Excel's re-saves: Windows-1252 on Windows; Mac Roman ("CSV (Macintosh)") with CR line ends
    mac = b"\r" in data and b"\n" not in data
    for codec in ("utf-8",) + (("mac_roman", "cp1252") if mac else ("cp1252", "mac_roman")):
        try:
            return data.decode(codec), b"", codec
        except UnicodeDecodeError:
            continue
    raise ExportError(f"{path}: neither UTF-8, Windows-1252 nor Mac Roman text; download the "
                      "gradebook again and upload it unchanged")


DELIMITERS = (",", "\t", ";")


def delimiter_of(first_line: str) -> str:
    """The delimiter the header row uses most outside quotes: comma (what every LMS writes by
    default), tab (Blackboard's tab-delimited download) or semicolon (Canvas's "separate with
    semicolons" option, and a spreadsheet's re-save in a locale whose decimal mark is a comma);
    comma on a tie."""
    outside = re.sub(r'"[^"]*"', "", first_line)
    return max(DELIMITERS, key=lambda d: (outside.count(d), d == ","))


def _cell_spans(text: str, start: int, end: int, delimiter: str) -> list:
    """(start, end) of each cell of the record text[start:end], read as the csv module reads
    it: a quote opens a quoted cell only as a cell's first character, ``""`` inside is a quote."""
    spans, begin, i, quoted = [], start, start, False
    while i < end:
        ch = text[i]
        if quoted:
            if ch == '"':
                if text[i + 1:i + 2] == '"':
                    i += 1
                else:
                    quoted = False
        elif ch == '"' and i == begin:
            quoted = True
        elif ch == delimiter:
            spans.append((begin, i))
            begin = i + 1
        i += 1
    spans.append((begin, end))
    return spans


def _unquote(raw: str) -> str:
    return raw[1:-1].replace('""', '"') if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw


def read_table(path) -> Table:
    """Read a CSV or tab-delimited file with the csv module, keeping its raw text and layout.

    Raises ExportError naming the file when it is missing, empty or not text.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ExportError(f"No gradebook file at {path}.") from None
    text, bom, codec = _decode(data, path)
    lines = _LINE.findall(text)
    if not lines or not lines[0].strip():
        raise ExportError(f"{path} is empty or its first line is blank; it should start with "
                          "the gradebook's header row")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    table = Table(path, text, bom, codec, delimiter_of(lines[0]))
    reader = csv.reader(iter(lines), delimiter=table.delimiter, strict=False)
    consumed = 0
    try:
        for values in reader:
            start, end = offsets[consumed], offsets[reader.line_num]
            ending = _ENDING.search(text, start, end)
            end = ending.start() if ending else end
            spans = _cell_spans(text, start, end, table.delimiter) if values else []
            if [_unquote(text[a:b]) for a, b in spans] != values:
                spans = None        # a layout this scanner does not follow: rewrite the record
            table.records.append(Record(values, spans, start, end, consumed + 1))
            consumed = reader.line_num
    except csv.Error as exc:
        raise ExportError(f"{path}, line {reader.line_num}: not a valid CSV file ({exc})") from None
    head = table.records[0].spans or []
    table.quote_all = bool(head) and all(text[a:a + 1] == '"' for a, _ in head)
    return table


def _serialise(values: list, delimiter: str, quote_all: bool) -> str:
    buf = io.StringIO()
    csv.writer(buf, delimiter=delimiter, lineterminator="",
               quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL).writerow(values)
    return buf.getvalue()


def write_table(table: Table, changes: dict, out) -> None:
    """Write ``table`` to ``out`` with ``changes`` ({(record index, column index): text}) made.

    Only the changed cells' bytes differ: a new value is quoted when the cell it replaces was
    quoted (or when it must be), in the file's own delimiter, encoding and byte order mark.
    """
    edits = []     # (start, end, new text)
    by_record = {}
    for (r, c), value in changes.items():
        by_record.setdefault(r, {})[c] = value
    for r, cells in by_record.items():
        rec = table.records[r]
        if rec.spans is None:    # rewrite the whole record, quoting its cells as the header does
            values = list(rec.values)
            for c, value in cells.items():
                values[c] = value
            edits.append((rec.start, rec.end, _serialise(values, table.delimiter, table.quote_all)))
            continue
        for c, value in cells.items():
            a, b = rec.spans[c]
            quoted = table.text[a:a + 1] == '"'
            edits.append((a, b, _serialise([value], table.delimiter, quoted)))
    text, last, parts = table.text, 0, []
    for a, b, new in sorted(edits):
        parts += [text[last:a], new]
        last = b
    parts.append(text[last:])
    data = table.bom + "".join(parts).encode(table.codec)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
