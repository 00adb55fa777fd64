"""compare page: being built."""
import streamlit as st

st.header("compare")
st.info("This page is being built.")
