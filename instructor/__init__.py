"""The instructor's folder: reference solutions, left out of the student copy (.gitattributes: export-ignore;
`make student-copy`)."""
